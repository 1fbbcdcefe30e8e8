//! In-flight (concurrency) limit: at most `limit` requests of one key at
//! once, each holding a slot until it ends.
//!
//! A slot is a holder with a deadline (`now + hold_us`): a holder whose
//! deadline has passed no longer counts, so a slot taken by a process that
//! crashed comes back after the hold timeout, while a live request pushes
//! its deadline on (a renewal). A request takes one slot whatever its cost;
//! a cost of zero (a peek) takes none. Without a holder id the limit is
//! checked but nothing is taken (the store names the holder, see
//! [`Algorithm::decide_as`](super::Algorithm::decide_as)).
//!
//! A blocked request is told to retry after [`RETRY_US`]: slots come back
//! when requests end, which no deadline predicts (a deadline only bounds
//! how long a crashed holder keeps one), so the answer is short.
//!
//! A key lives one hold timeout past its latest deadline, so the holders a
//! crashed process left are still there, expired, when the next admission
//! drops them, and are counted (`ratewatch_inflight_expired_holders_total`).
//!
//! `lua/concurrency.lua` repeats the same arithmetic on a sorted set
//! (member = holder id, score = deadline); parity tests hold them together.

use super::{State, Step, Verdict};
use crate::clock::{MICROS_PER_SEC, Micros};

/// The `Retry-After` of a request refused by an in-flight limit: one
/// second, the shortest a header can say.
pub const RETRY_US: u64 = MICROS_PER_SEC;

/// The holders of `state` still live at `now` (deadline later than now).
fn live(state: Option<&State>, now: Micros) -> Vec<(String, Micros)> {
    match state {
        Some(State::Holders(h)) => h.iter().filter(|(_, d)| *d > now).cloned().collect(),
        _ => Vec::new(),
    }
}

/// Holders of `state` whose deadline had passed at `now`: counted as
/// "expired holders" when a write drops them.
pub fn expired(state: Option<&State>, now: Micros) -> u64 {
    match state {
        Some(State::Holders(h)) => h.iter().filter(|(_, d)| *d <= now).count() as u64,
        _ => 0,
    }
}

pub(super) fn decide(
    limit: u64,
    hold_us: u64,
    state: Option<&State>,
    now: Micros,
    cost: u64,
    holder: Option<&str>,
) -> Step {
    let mut holders = live(state, now);
    let count = holders.len() as u64;
    // One hold timeout past the latest deadline: a holder that expired is
    // still there for the next admission to drop and count (an expired
    // holder), rather than vanishing with its key.
    let ttl = holders
        .iter()
        .map(|(_, d)| *d)
        .max()
        .unwrap_or(now)
        .max(now + hold_us)
        - now
        + hold_us;
    let takes = u64::from(cost > 0);
    if count + takes <= limit {
        let state = match holder {
            Some(id) if takes == 1 => {
                holders.retain(|(h, _)| h != id);
                holders.push((id.to_owned(), now + hold_us));
                Some(State::Holders(holders))
            }
            _ => None,
        };
        Step {
            verdict: Verdict {
                allowed: true,
                remaining: (limit - count - takes) as f64,
                reset_after_us: 0,
                retry_after_us: 0,
                delay_us: 0,
            },
            state,
            ttl_us: ttl,
        }
    } else {
        Step {
            verdict: Verdict {
                allowed: false,
                remaining: limit.saturating_sub(count) as f64,
                reset_after_us: RETRY_US,
                retry_after_us: RETRY_US,
                delay_us: 0,
            },
            state: None,
            ttl_us: ttl,
        }
    }
}

/// `state` without `holder` (a release), or `None` if nothing changes.
pub fn release(state: Option<&State>, holder: &str) -> Option<State> {
    match state {
        Some(State::Holders(h)) if h.iter().any(|(id, _)| id == holder) => Some(State::Holders(
            h.iter().filter(|(id, _)| id != holder).cloned().collect(),
        )),
        _ => None,
    }
}

/// `state` with `holder`'s deadline pushed to `now + hold_us` (a renewal),
/// or `None` when the holder is gone (expired, released, or never held).
pub fn renew(state: Option<&State>, holder: &str, now: Micros, hold_us: u64) -> Option<State> {
    match state {
        Some(State::Holders(h)) if h.iter().any(|(id, d)| id == holder && *d > now) => {
            Some(State::Holders(
                h.iter()
                    .map(|(id, d)| {
                        let d = if id == holder { now + hold_us } else { *d };
                        (id.clone(), d)
                    })
                    .collect(),
            ))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOLD: u64 = 2 * MICROS_PER_SEC;

    #[test]
    fn two_slots_admit_two_holders_and_refuse_the_third() {
        let a = decide(2, HOLD, None, 1_000, 1, Some("a"));
        let b = decide(2, HOLD, a.state.as_ref(), 1_001, 1, Some("b"));
        let c = decide(2, HOLD, b.state.as_ref(), 1_002, 1, Some("c"));
        assert!(a.verdict.allowed && b.verdict.allowed && !c.verdict.allowed);
        assert_eq!(c.verdict.retry_after_us, RETRY_US);
        assert_eq!(b.verdict.remaining, 0.0);
    }

    #[test]
    fn a_request_takes_one_slot_whatever_its_cost_and_a_peek_takes_none() {
        let a = decide(1, HOLD, None, 1_000, 50, Some("a"));
        assert!(a.verdict.allowed);
        let peek = decide(1, HOLD, a.state.as_ref(), 1_001, 0, Some("b"));
        // A peek reports the slots left (none) and takes nothing.
        assert_eq!(peek.verdict.remaining, 0.0);
        assert!(peek.state.is_none());
    }

    #[test]
    fn a_released_slot_is_free_again_and_an_expired_holder_stops_counting() {
        let a = decide(1, HOLD, None, 1_000, 1, Some("a"));
        let freed = release(a.state.as_ref(), "a");
        assert!(
            decide(1, HOLD, freed.as_ref(), 1_001, 1, Some("b"))
                .verdict
                .allowed
        );
        let late = 1_000 + HOLD;
        assert_eq!(expired(a.state.as_ref(), late), 1);
        assert!(
            decide(1, HOLD, a.state.as_ref(), late, 1, Some("b"))
                .verdict
                .allowed
        );
    }

    #[test]
    fn a_renewal_keeps_a_holder_past_its_first_deadline_and_fails_once_gone() {
        let a = decide(1, HOLD, None, 1_000, 1, Some("a"));
        let renewed = renew(a.state.as_ref(), "a", 1_000 + HOLD / 2, HOLD).unwrap();
        let after_first = 1_000 + HOLD;
        assert!(
            !decide(1, HOLD, Some(&renewed), after_first, 1, Some("b"))
                .verdict
                .allowed
        );
        assert!(renew(a.state.as_ref(), "a", after_first, HOLD).is_none());
        assert!(renew(a.state.as_ref(), "x", 1_001, HOLD).is_none());
    }
}
