//! The interval's aggregate, one part per thread group.
//!
//! Every decision adds its event to the aggregate. Behind one lock, two
//! worker threads deciding at once queue on each other: in process, on two
//! threads, the fleet view halved the decisions per second. Each thread
//! now adds to its own part (picked once per thread, round robin), and a
//! flush merges the parts into one [`Batch`]: counters and round trips
//! add up exactly; each part's top-K keeps `top_keys` entries, and the
//! merged top-K keeps the largest of them.

use std::sync::atomic::{AtomicUsize, Ordering};

use ahash::AHashSet;
use parking_lot::Mutex;

use super::aggregate::{Batch, MAX_SERIES};
use super::{Backlog, Event};

/// A part on its own cache lines, so two threads' locks do not share one.
#[repr(align(128))]
struct Part(Mutex<Batch>);

/// The aggregate, split per thread.
pub(crate) struct ShardedBatch {
    parts: Box<[Part]>,
    top_keys: usize,
}

static NEXT_SLOT: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// This thread's part index (modulo the number of parts).
    static SLOT: usize = NEXT_SLOT.fetch_add(1, Ordering::Relaxed);
}

impl ShardedBatch {
    /// One part per core (at most 16).
    pub(crate) fn new(top_keys: usize) -> Self {
        let n = std::thread::available_parallelism().map_or(1, |n| n.get().clamp(1, 16));
        Self {
            parts: (0..n)
                .map(|_| Part(Mutex::new(Batch::new(top_keys))))
                .collect(),
            top_keys,
        }
    }

    /// Adds one event to the calling thread's part.
    pub(crate) fn add(&self, e: &Event) {
        let i = SLOT.with(|s| *s) % self.parts.len();
        self.parts[i].0.lock().add(e);
    }

    /// Takes every part, merged, leaving empty ones.
    pub(crate) fn take(&self) -> Batch {
        let mut out = Batch::new(self.top_keys);
        for p in self.parts.iter() {
            let part = std::mem::replace(&mut *p.0.lock(), Batch::new(self.top_keys));
            merge(&mut out, part);
        }
        out
    }

    /// What the parts hold together.
    pub(crate) fn backlog(&self) -> Backlog {
        let mut series = AHashSet::new();
        let mut identities = AHashSet::new();
        let mut events = 0;
        for p in self.parts.iter() {
            let b = p.0.lock();
            events += b.events;
            series.extend(b.counters.iter().map(|(key, _)| key.clone()));
            identities.extend(b.top.top().into_iter().map(|(k, _)| k));
        }
        Backlog {
            events,
            series: series.len().min(MAX_SERIES),
            identities: identities.len().min(self.top_keys),
        }
    }
}

/// Adds `from` into `into`, within the same bounds one part keeps.
fn merge(into: &mut Batch, mut from: Batch) {
    from.settle();
    into.events += from.events;
    into.overflow += from.overflow;
    for (key, n) in from.counters.drain() {
        if !into.counters.add(key, n) {
            into.overflow += n;
            into.events = into.events.saturating_sub(n);
        }
    }
    for (k, n) in from.top.take() {
        into.top.add(&k, n);
    }
    for (k, n) in from.hot.take() {
        into.hot.add(&k, n);
    }
    for ((tier, unit), n) in from.units.drain(..) {
        into.add_unit_total(&tier, &unit, n);
    }
    for (unit, mut top) in from.unit_top.drain(..) {
        for (member, n) in top.take() {
            into.add_unit_member(&unit, &member, n);
        }
    }
    for (shard, buckets) in from.rtt.drain() {
        if let Some(b) = into.rtt.get_mut(&shard) {
            for (x, y) in b.iter_mut().zip(buckets) {
                *x += y;
            }
        } else if into.rtt.len() < MAX_SERIES {
            into.rtt.insert(shard, buckets);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::telemetry::Outcome;

    fn event(identity: &str, outcome: Outcome) -> Event {
        Event {
            tier: Arc::from("free"),
            route: Arc::from("*"),
            limit: Some(Arc::from("burst")),
            exceeded: Vec::new(),
            outcome,
            shard: Arc::from("memory"),
            identity: identity.into(),
            cost: 1,
            units: Default::default(),
            redis_rtt: Some(std::time::Duration::from_micros(300)),
            fallback: None,
        }
    }

    #[test]
    fn parts_filled_from_several_threads_merge_into_exact_counts() {
        let b = Arc::new(ShardedBatch::new(10));
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let b = b.clone();
                std::thread::spawn(move || {
                    for i in 0..100 {
                        let outcome = if i % 4 == 0 {
                            Outcome::Blocked
                        } else {
                            Outcome::Allowed
                        };
                        b.add(&event(&format!("id{}", t % 2), outcome));
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(b.backlog().events, 400);
        assert_eq!(b.backlog().series, 2);
        let merged = b.take();
        assert_eq!(merged.events, 400);
        let allowed: u64 = merged
            .counters
            .iter()
            .filter(|(k, _)| k.3 == Outcome::Allowed)
            .map(|(_, n)| *n)
            .sum();
        assert_eq!(allowed, 300);
        assert_eq!(merged.top.top().iter().map(|(_, n)| n).sum::<u64>(), 100);
        assert_eq!(merged.hot.top().iter().map(|(_, n)| n).sum::<u64>(), 400);
        assert_eq!(merged.rtt["memory"].iter().sum::<u64>(), 400);
        assert_eq!(b.backlog().events, 0, "taking leaves the parts empty");
    }
}
