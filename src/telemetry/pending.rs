//! Flushed batches the fleet view in Redis has not taken yet.
//!
//! An outage is when an operator most needs the fleet view, and the moment
//! Redis returns is when they look at it. So a batch whose write fails is
//! kept, still tagged with the time it was flushed, and written into its
//! original buckets once Redis answers again. Batches of the same 10 s
//! bucket are summed into one entry, so the buffer grows with the length of
//! the outage, not with the traffic: at most [`MAX_PENDING_BUCKETS`]
//! entries (one hour of 10 s buckets), each bounded like one flush. Past
//! the cap the oldest entry is dropped and its events counted in
//! `ratewatch_telemetry_dropped_total{reason="buffer_full"}`.

use std::collections::VecDeque;

use ahash::AHashMap;
use parking_lot::Mutex;

use super::aggregate::Flat;
use super::fleet::{RESOLUTIONS, Resolution};
use super::metrics::{DropReason, record_dropped};

/// Most 10 s buckets kept for a later write: an hour of outage, as long as
/// Redis keeps 10 s buckets anyway.
pub(crate) const MAX_PENDING_BUCKETS: usize = 360;

/// One bucket's batch waiting for Redis.
#[derive(Debug)]
pub(crate) struct Pending {
    /// When it was flushed (Unix seconds): its buckets are the ones holding
    /// this time.
    pub at: u64,
    /// What to write.
    pub flat: Flat,
    /// Per resolution of [`RESOLUTIONS`]: already written (a failure
    /// between the two pipelines of a write must not count the first twice).
    pub done: [bool; RESOLUTIONS.len()],
}

impl Pending {
    /// A batch flushed at `at`, written nowhere yet.
    pub fn new(at: u64, flat: Flat) -> Self {
        Self {
            at,
            flat,
            done: [false; RESOLUTIONS.len()],
        }
    }

    fn bucket(&self) -> u64 {
        RESOLUTIONS[0].bucket_of(self.at)
    }
}

/// What the buffer holds, for the page.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct PendingStats {
    /// Buckets waiting.
    pub buckets: usize,
    /// Events in them.
    pub events: u64,
    /// Events dropped because the buffer was full, since start.
    pub dropped: u64,
}

/// The bounded buffer of batches not yet in Redis.
#[derive(Debug)]
pub(crate) struct PendingBuckets {
    queue: Mutex<VecDeque<Pending>>,
    cap: usize,
    /// Identities kept per table of one entry.
    keep_top: usize,
    dropped: Mutex<u64>,
    /// Taken by a write still under way (buckets, events): still waiting,
    /// as far as the page is concerned, until written or put back.
    in_flight: Mutex<(usize, u64)>,
}

impl PendingBuckets {
    pub fn new(cap: usize, keep_top: usize) -> Self {
        Self {
            queue: Mutex::new(VecDeque::new()),
            cap: cap.max(1),
            keep_top: keep_top.max(1),
            dropped: Mutex::new(0),
            in_flight: Mutex::new((0, 0)),
        }
    }

    /// Adds a batch after the others (summed into the last entry when it
    /// is of the same bucket and written to the same resolutions), then
    /// drops the oldest entries past the cap.
    pub fn push(&self, p: Pending) {
        let mut q = self.queue.lock();
        match q.back_mut() {
            Some(last) if last.bucket() == p.bucket() && last.done == p.done => {
                merge_into(&mut last.flat, p.flat, self.keep_top);
            }
            _ => q.push_back(p),
        }
        while q.len() > self.cap {
            if let Some(old) = q.pop_front() {
                *self.dropped.lock() += old.flat.events;
                record_dropped(DropReason::BufferFull, old.flat.events);
            }
        }
    }

    /// Takes every entry, oldest first, for a write: each must then be
    /// either [`written`](Self::written) or [`put back`](Self::put_back).
    pub fn take(&self) -> VecDeque<Pending> {
        let mut q = self.queue.lock();
        let taken = std::mem::take(&mut *q);
        *self.in_flight.lock() = (taken.len(), taken.iter().map(|p| p.flat.events).sum());
        taken
    }

    /// A taken entry reached Redis.
    pub fn written(&self, p: &Pending) {
        let mut f = self.in_flight.lock();
        f.0 = f.0.saturating_sub(1);
        f.1 = f.1.saturating_sub(p.flat.events);
    }

    /// Taken entries that did not reach Redis, oldest first: back in front
    /// of anything pushed meanwhile.
    pub fn put_back(&self, items: impl IntoIterator<Item = Pending>) {
        let mut q = self.queue.lock();
        let newer = std::mem::take(&mut *q);
        drop(q);
        for p in items.into_iter().chain(newer) {
            self.push(p);
        }
        *self.in_flight.lock() = (0, 0);
    }

    /// What waits (including what a write under way took), and what was
    /// dropped.
    pub fn stats(&self) -> PendingStats {
        let q = self.queue.lock();
        let f = *self.in_flight.lock();
        PendingStats {
            buckets: q.len() + f.0,
            events: q.iter().map(|p| p.flat.events).sum::<u64>() + f.1,
            dropped: *self.dropped.lock(),
        }
    }
}

/// Whether `res`'s bucket holding `at` has outlived its retention at `now`:
/// Redis would have expired it already, so it is not written.
pub(crate) fn expired(res: Resolution, at: u64, now: u64) -> bool {
    res.bucket_of(at) + res.keep + res.secs <= now
}

/// Keeps, per field, the later of the two times.
pub(crate) fn latest(a: &mut Vec<(String, u64)>, b: Vec<(String, u64)>) {
    let mut m: AHashMap<String, u64> = std::mem::take(a).into_iter().collect();
    for (k, t) in b {
        let e = m.entry(k).or_insert(0);
        *e = (*e).max(t);
    }
    *a = m.into_iter().collect();
}

/// Sums `b` into `a` field by field; the identity tables keep their
/// `keep_top` highest members, as Redis would after writing both.
fn merge_into(a: &mut Flat, b: Flat, keep_top: usize) {
    fn sum(a: &mut Vec<(String, u64)>, b: Vec<(String, u64)>) {
        let mut m: AHashMap<String, u64> = std::mem::take(a).into_iter().collect();
        for (k, n) in b {
            *m.entry(k).or_insert(0) += n;
        }
        *a = m.into_iter().collect();
    }
    sum(&mut a.counters, b.counters);
    sum(&mut a.rtt, b.rtt);
    sum(&mut a.trips, b.trips);
    sum(&mut a.breakers, b.breakers);
    sum(&mut a.policies, b.policies);
    sum(&mut a.instances, b.instances);
    sum(&mut a.units, b.units);
    sum(&mut a.unit_keys, b.unit_keys);
    super::aggregate::keep_top_per_unit(&mut a.unit_keys, keep_top);
    latest(&mut a.reported, b.reported);
    for (table, more) in [(&mut a.top, b.top), (&mut a.hot, b.hot)] {
        sum(table, more);
        if table.len() > keep_top {
            table.sort_by(|x, y| y.1.cmp(&x.1).then_with(|| x.0.cmp(&y.0)));
            table.truncate(keep_top);
        }
    }
    a.events += b.events;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flat(events: u64) -> Flat {
        Flat {
            counters: vec![("free|fallback_allowed|s|*".into(), events)],
            trips: vec![("s".into(), 1)],
            events,
            ..Flat::default()
        }
    }

    #[test]
    fn batches_of_one_bucket_are_summed_and_the_oldest_past_the_cap_dropped_and_counted() {
        let p = PendingBuckets::new(2, 4);
        p.push(Pending::new(100, flat(3)));
        p.push(Pending::new(105, flat(4)));
        assert_eq!(
            p.stats(),
            PendingStats {
                buckets: 1,
                events: 7,
                dropped: 0
            }
        );
        p.push(Pending::new(110, flat(5)));
        p.push(Pending::new(120, flat(6)));
        assert_eq!(
            p.stats(),
            PendingStats {
                buckets: 2,
                events: 11,
                dropped: 7
            }
        );
        let q = p.take();
        assert_eq!(q[0].at, 110);
        assert_eq!(
            q[1].flat.counters,
            vec![("free|fallback_allowed|s|*".into(), 6)]
        );
        // Taken for a write: still waiting until written or put back.
        assert_eq!(p.stats().buckets, 2);
        p.written(&q[0]);
        assert_eq!((p.stats().buckets, p.stats().events), (1, 6));
        p.put_back(q.into_iter().skip(1));
        assert_eq!((p.stats().buckets, p.stats().events), (1, 6));
        let _ = p.take();
        p.put_back([]);
        assert_eq!(p.stats().buckets, 0);
        let mut first = PendingBuckets::new(4, 4);
        first.push(Pending::new(100, flat(1)));
        first.push(Pending::new(101, flat(2)));
        let q = first.queue.get_mut();
        assert_eq!(q[0].flat.counters[0].1, 3);
        assert_eq!(q[0].flat.trips, vec![("s".into(), 2)]);
    }

    #[test]
    fn a_bucket_past_its_retention_is_expired() {
        let fine = RESOLUTIONS[0];
        assert!(!expired(fine, 1000, 1000 + fine.keep));
        assert!(expired(fine, 1000, 1000 + fine.keep + fine.secs));
    }
}
