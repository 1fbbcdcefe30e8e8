//! Leaky bucket: a queue of `capacity` units that drains at a fixed rate.
//!
//! The state is the time the queue will be empty. As a *meter*
//! (`max_delay_us = 0`) it rejects a request that does not fit in the queue,
//! which is exactly GCRA with `burst = capacity`. As a *shaper* it admits a
//! request that fits and tells the caller to hold it for as long as the work
//! queued ahead of it takes to drain, so the upstream sees a smooth rate; a
//! request that would wait longer than `max_delay_us` is rejected instead.

use super::Step;
use crate::algorithm::State;
use crate::clock::Micros;

pub(super) fn decide(
    interval: u64,
    capacity: u64,
    max_delay_us: u64,
    state: Option<&State>,
    now: Micros,
    cost: u64,
) -> Step {
    super::gcra::decide(interval, capacity, max_delay_us, state, now, cost)
}
