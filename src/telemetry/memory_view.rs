//! The fleet view kept in process: the whole fleet for the memory store
//! (one instance is the fleet), and this instance's own view beside the
//! Redis one, so the dashboard has something true to show when Redis does
//! not answer. A bounded ring: at most one hour of 10 s buckets and two
//! days of 1 min buckets, each holding at most `2 * top_keys` identities
//! per table.

use std::collections::BTreeMap;

use ahash::AHashMap;
use parking_lot::Mutex;

use super::aggregate::Flat;
use super::fleet::{RESOLUTIONS, Resolution};

#[derive(Debug, Default)]
struct Bucket {
    counters: AHashMap<String, u64>,
    top: AHashMap<String, u64>,
    hot: AHashMap<String, u64>,
    rtt: AHashMap<String, u64>,
    trips: AHashMap<String, u64>,
    breakers: AHashMap<String, u64>,
    policies: AHashMap<String, u64>,
    instances: AHashMap<String, u64>,
    reported: AHashMap<String, u64>,
    units: AHashMap<String, u64>,
    unit_keys: AHashMap<String, u64>,
}

/// In-process buckets, keyed by (resolution width, bucket start).
#[derive(Debug)]
pub(crate) struct MemoryView {
    buckets: Mutex<BTreeMap<(u64, u64), Bucket>>,
    top_keys: usize,
    /// Longest a bucket is kept, whatever its resolution keeps.
    max_keep: u64,
}

/// How long this instance's own view is kept beside a Redis fleet view:
/// enough to answer "since when" during an outage, at a fraction of the
/// memory two days of minute buckets would take.
#[cfg_attr(not(feature = "redis-store"), allow(dead_code))]
pub(crate) const KEEP_BESIDE_REDIS: u64 = 6 * 3600;

impl MemoryView {
    /// A view keeping every resolution's full retention.
    pub fn new(top_keys: usize) -> Self {
        Self::with_max_keep(top_keys, u64::MAX)
    }

    /// A view keeping no bucket longer than `max_keep` seconds.
    pub fn with_max_keep(top_keys: usize, max_keep: u64) -> Self {
        Self {
            buckets: Mutex::new(BTreeMap::new()),
            top_keys: top_keys.max(1),
            max_keep,
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
            for (table, fields) in [(&mut b.top, &flat.top), (&mut b.hot, &flat.hot)] {
                add(table, fields);
                if table.len() > 2 * self.top_keys {
                    trim(table, self.top_keys);
                }
            }
            add(&mut b.units, &flat.units);
            add(&mut b.unit_keys, &flat.unit_keys);
            if b.unit_keys.len() > 2 * self.top_keys {
                let mut v = pairs(&b.unit_keys);
                super::aggregate::keep_top_per_unit(&mut v, self.top_keys);
                b.unit_keys = v.into_iter().collect();
            }
            add(&mut b.rtt, &flat.rtt);
            add(&mut b.trips, &flat.trips);
            add(&mut b.breakers, &flat.breakers);
            add(&mut b.policies, &flat.policies);
            add(&mut b.instances, &flat.instances);
            for (k, t) in &flat.reported {
                let e = b.reported.entry(k.clone()).or_insert(0);
                *e = (*e).max(*t);
            }
        }
        buckets.retain(|(secs, start), _| {
            let keep = RESOLUTIONS
                .iter()
                .find(|r| r.secs == *secs)
                .map_or(0, |r| r.keep)
                .min(self.max_keep);
            start + keep + secs > now
        });
    }

    /// The buckets of `starts` at resolution `res`, each with at most
    /// `top_keys` entries per top table.
    pub fn read(&self, res: Resolution, starts: &[u64]) -> Vec<(u64, Flat)> {
        let buckets = self.buckets.lock();
        starts
            .iter()
            .filter_map(|s| {
                buckets.get(&(res.secs, *s)).map(|b| {
                    let flat = Flat {
                        counters: pairs(&b.counters),
                        top: highest(&b.top, self.top_keys),
                        hot: highest(&b.hot, self.top_keys),
                        rtt: pairs(&b.rtt),
                        trips: pairs(&b.trips),
                        breakers: pairs(&b.breakers),
                        policies: pairs(&b.policies),
                        instances: pairs(&b.instances),
                        reported: pairs(&b.reported),
                        units: pairs(&b.units),
                        unit_keys: {
                            let mut v = pairs(&b.unit_keys);
                            super::aggregate::keep_top_per_unit(&mut v, self.top_keys);
                            v
                        },
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

fn add(table: &mut AHashMap<String, u64>, fields: &[(String, u64)]) {
    for (k, n) in fields {
        *table.entry(k.clone()).or_insert(0) += n;
    }
}

/// The `n` highest counts, highest first.
fn highest(m: &AHashMap<String, u64>, n: usize) -> Vec<(String, u64)> {
    let mut v = pairs(m);
    v.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    v.truncate(n);
    v
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
    fn a_view_beside_redis_keeps_six_hours() {
        let view = MemoryView::with_max_keep(3, KEEP_BESIDE_REDIS);
        let flat = Flat {
            counters: vec![("free|allowed|memory|*".into(), 1)],
            ..Flat::default()
        };
        let t0 = 1_700_000_000;
        for i in 0..(86_400 / 10) {
            view.apply(t0 + i * 10, &flat);
        }
        assert!(view.len() <= 361 + 361, "{}", view.len());
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
        assert!(read[0].1.top.len() <= 2);
        assert!(read[0].1.top.iter().any(|(k, _)| k == "id99"));
    }
}
