//! The fleet view kept in process, for the memory store (one instance is
//! the fleet). A bounded ring: at most one hour of 10 s buckets and two
//! days of 1 min buckets, each holding at most `top_keys` identities.

use std::collections::BTreeMap;

use ahash::AHashMap;
use parking_lot::Mutex;

use super::aggregate::Flat;
use super::fleet::{RESOLUTIONS, Resolution};

#[derive(Debug, Default)]
struct Bucket {
    counters: AHashMap<String, u64>,
    top: AHashMap<String, u64>,
    rtt: AHashMap<String, u64>,
    trips: AHashMap<String, u64>,
    policies: AHashMap<String, u64>,
}

/// In-process buckets, keyed by (resolution width, bucket start).
#[derive(Debug)]
pub(crate) struct MemoryView {
    buckets: Mutex<BTreeMap<(u64, u64), Bucket>>,
    top_keys: usize,
}

impl MemoryView {
    pub fn new(top_keys: usize) -> Self {
        Self {
            buckets: Mutex::new(BTreeMap::new()),
            top_keys: top_keys.max(1),
        }
    }

    /// Adds a flushed batch to the buckets holding `now`, then forgets
    /// buckets past their retention.
    pub fn apply(&self, now: u64, flat: &Flat) {
        let mut buckets = self.buckets.lock();
        for res in RESOLUTIONS {
            let b = buckets.entry((res.secs, res.bucket_of(now))).or_default();
            for (k, n) in &flat.counters {
                *b.counters.entry(k.clone()).or_insert(0) += n;
            }
            for (k, n) in &flat.top {
                *b.top.entry(k.clone()).or_insert(0) += n;
            }
            if b.top.len() > 2 * self.top_keys {
                trim(&mut b.top, self.top_keys);
            }
            for (k, n) in &flat.rtt {
                *b.rtt.entry(k.clone()).or_insert(0) += n;
            }
            for (k, n) in &flat.trips {
                *b.trips.entry(k.clone()).or_insert(0) += n;
            }
            for (k, n) in &flat.policies {
                *b.policies.entry(k.clone()).or_insert(0) += n;
            }
        }
        buckets.retain(|(secs, start), _| {
            let keep = RESOLUTIONS
                .iter()
                .find(|r| r.secs == *secs)
                .map_or(0, |r| r.keep);
            start + keep + secs > now
        });
    }

    /// The buckets of `starts` at resolution `res`.
    pub fn read(&self, res: Resolution, starts: &[u64]) -> Vec<(u64, Flat)> {
        let buckets = self.buckets.lock();
        starts
            .iter()
            .filter_map(|s| {
                buckets.get(&(res.secs, *s)).map(|b| {
                    let flat = Flat {
                        counters: pairs(&b.counters),
                        top: pairs(&b.top),
                        rtt: pairs(&b.rtt),
                        trips: pairs(&b.trips),
                        policies: pairs(&b.policies),
                        events: 0,
                    };
                    (*s, flat)
                })
            })
            .collect()
    }

    /// How many buckets are held (bounded by the retention).
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.buckets.lock().len()
    }
}

fn pairs(m: &AHashMap<String, u64>) -> Vec<(String, u64)> {
    m.iter().map(|(k, v)| (k.clone(), *v)).collect()
}

/// Keeps the `keep` highest counts.
fn trim(m: &mut AHashMap<String, u64>, keep: usize) {
    let mut v: Vec<(String, u64)> = m.drain().collect();
    v.sort_by_key(|e| std::cmp::Reverse(e.1));
    v.truncate(keep);
    m.extend(v);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ring_forgets_buckets_past_their_retention() {
        let view = MemoryView::new(3);
        let flat = Flat {
            counters: vec![("free|allowed|memory|*".into(), 1)],
            ..Flat::default()
        };
        let t0 = 1_700_000_000;
        for i in 0..(3 * 86_400 / 10) {
            view.apply(t0 + i * 10, &flat);
        }
        // 360 ten-second buckets (plus the current one) and 2880 minutes.
        assert!(view.len() <= 361 + 2881, "{}", view.len());
    }

    #[test]
    fn a_bucket_keeps_only_the_most_blocked_identities() {
        let view = MemoryView::new(2);
        let t = 1_700_000_000;
        for i in 0..100u64 {
            let flat = Flat {
                top: vec![(format!("id{i}"), i)],
                ..Flat::default()
            };
            view.apply(t, &flat);
        }
        let read = view.read(RESOLUTIONS[0], &[RESOLUTIONS[0].bucket_of(t)]);
        assert!(read[0].1.top.len() <= 4);
        assert!(read[0].1.top.iter().any(|(k, _)| k == "id99"));
    }
}
