//! The interval's decision counters, one per (tier, route, shard, outcome).
//!
//! Every decision finds its series. By content that hashes three strings
//! and clones three shared reference counts, which two deciding threads
//! bounce between their cores. The limiter passes the same label strings
//! (the policy's and the store's) with every event, so series are found by
//! the addresses of those strings first: four words hashed, nothing
//! cloned. The address cache holds a clone of the strings it is keyed by,
//! so an address cannot be reused while cached; events whose labels are
//! fresh strings each time (built by hand) miss it and are counted by
//! content, exactly as before.

use std::sync::Arc;

use ahash::AHashMap;

use super::{Event, Outcome};

/// Counter series key: tier, route, shard, outcome.
pub(crate) type SeriesKey = (Arc<str>, Arc<str>, Arc<str>, Outcome);

/// A series by the addresses of its tier, route and shard, and its outcome.
type SeriesId = (usize, usize, usize, Outcome);

/// Most addresses cached; past it, events are counted by content.
const MAX_IDS: usize = 1024;

/// Counts per series, at most `max` series.
#[derive(Debug)]
pub(crate) struct Series {
    max: usize,
    slots: Vec<(SeriesKey, u64)>,
    by_key: AHashMap<SeriesKey, usize>,
    /// The labels each address stands for (kept alive), and its slot.
    by_id: AHashMap<SeriesId, (SeriesKey, usize)>,
}

fn key_of(e: &Event) -> SeriesKey {
    (e.tier.clone(), e.route.clone(), e.shard.clone(), e.outcome)
}

fn id_of(e: &Event) -> SeriesId {
    let addr = |s: &Arc<str>| Arc::as_ptr(s).cast::<u8>() as usize;
    (addr(&e.tier), addr(&e.route), addr(&e.shard), e.outcome)
}

impl Series {
    /// No series yet; room for `max`.
    pub(crate) fn new(max: usize) -> Self {
        Self {
            max,
            slots: Vec::new(),
            by_key: AHashMap::new(),
            by_id: AHashMap::new(),
        }
    }

    /// Counts one decision of `e`'s series; `false` when the series is new
    /// and there is no room for it.
    pub(crate) fn add_event(&mut self, e: &Event) -> bool {
        let id = id_of(e);
        if let Some((_, slot)) = self.by_id.get(&id) {
            self.slots[*slot].1 += 1;
            return true;
        }
        let Some(slot) = self.slot(key_of(e)) else {
            return false;
        };
        self.slots[slot].1 += 1;
        if self.by_id.len() < MAX_IDS {
            self.by_id.insert(id, (key_of(e), slot));
        }
        true
    }

    /// Adds `n` to `key`'s series; `false` when it is new and there is no
    /// room for it.
    pub(crate) fn add(&mut self, key: SeriesKey, n: u64) -> bool {
        match self.slot(key) {
            Some(slot) => {
                self.slots[slot].1 += n;
                true
            }
            None => false,
        }
    }

    fn slot(&mut self, key: SeriesKey) -> Option<usize> {
        if let Some(&slot) = self.by_key.get(&key) {
            return Some(slot);
        }
        if self.slots.len() >= self.max {
            return None;
        }
        let slot = self.slots.len();
        self.slots.push((key.clone(), 0));
        self.by_key.insert(key, slot);
        Some(slot)
    }

    /// How many series are counted.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.slots.len()
    }

    /// The series and their counts.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &(SeriesKey, u64)> {
        self.slots.iter()
    }

    /// Takes every series, leaving none.
    pub(crate) fn drain(&mut self) -> std::vec::Drain<'_, (SeriesKey, u64)> {
        self.by_key.clear();
        self.by_id.clear();
        self.slots.drain(..)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(tier: Arc<str>) -> Event {
        Event {
            tier,
            route: Arc::from("*"),
            limit: None,
            exceeded: Vec::new(),
            outcome: Outcome::Allowed,
            shard: Arc::from("memory"),
            identity: "x".into(),
            cost: 1,
            units: Default::default(),
            redis_rtt: None,
            fallback: None,
        }
    }

    #[test]
    fn shared_and_fresh_label_strings_count_in_one_series_per_content() {
        let mut s = Series::new(4);
        let shared = event(Arc::from("free"));
        for _ in 0..3 {
            assert!(s.add_event(&shared));
            // A hand-built event with its own strings: the same series.
            assert!(s.add_event(&event(Arc::from("free"))));
        }
        assert!(s.add_event(&event(Arc::from("pro"))));
        let mut counts: Vec<(String, u64)> = s.iter().map(|(k, n)| (k.0.to_string(), *n)).collect();
        counts.sort();
        assert_eq!(counts, vec![("free".into(), 6), ("pro".into(), 1)]);
    }

    #[test]
    fn a_full_table_refuses_new_series_but_keeps_counting_known_ones() {
        let mut s = Series::new(1);
        assert!(s.add_event(&event(Arc::from("free"))));
        assert!(!s.add_event(&event(Arc::from("pro"))));
        assert!(s.add_event(&event(Arc::from("free"))));
        assert_eq!(s.len(), 1);
        assert_eq!(s.drain().map(|(_, n)| n).sum::<u64>(), 2);
        assert_eq!(s.len(), 0);
    }
}
