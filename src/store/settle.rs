//! A settle: what one request used beyond (or short of) what its decision
//! charged, applied to the limits that decision charged, in one atomic
//! call per shard (per slot on a cluster).

use super::Item;
use crate::algorithm::Adjust;
use crate::clock::Micros;

/// One request's settle, for [`Store::settle`](super::Store::settle).
#[derive(Debug, Clone, Copy)]
pub struct Settle<'a> {
    /// The limits the decision charged (shadow limits that blocked and
    /// limits checked at cost 0 were not charged and are left out).
    pub items: &'a [Item],
    /// The time the decision was made at (the store's clock): a window
    /// counter gives units back only while the window holding it is the
    /// current one.
    pub charged_at: Micros,
    /// Units to charge or give back, the same for every item.
    pub adjust: Adjust,
    /// Settle at this time instead of the store's clock (tests).
    pub now: Option<Micros>,
}

impl<'a> Settle<'a> {
    /// `adjust` for `items` a decision at `charged_at` charged.
    pub fn new(items: &'a [Item], charged_at: Micros, adjust: Adjust) -> Self {
        Self {
            items,
            charged_at,
            adjust,
            now: None,
        }
    }

    /// Settles at `now` rather than on the store's clock.
    pub fn at(mut self, now: Micros) -> Self {
        self.now = Some(now);
        self
    }
}
