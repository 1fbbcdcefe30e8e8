//! What one instance gathers between two flushes: exact counters per
//! (tier, route, shard, outcome), blocked counts per identity in a bounded
//! [`TopK`], round-trip bucket counts per shard. Everything here is bounded:
//! label combinations are capped at [`MAX_SERIES`] (the rest is dropped and
//! counted), the top-K at `top_keys`, shards at [`MAX_SERIES`].

use std::sync::Arc;

use ahash::AHashMap;
use parking_lot::Mutex;

use super::metrics::RTT_BUCKETS;
use super::{Event, Outcome, TopK};

/// Most distinct counter series (or RTT shards) one interval keeps. Labels
/// come from the policy, so a real deployment stays far below it.
pub const MAX_SERIES: usize = 4096;

/// Counter series key: tier, route, shard, outcome.
pub(crate) type SeriesKey = (Arc<str>, Arc<str>, Arc<str>, Outcome);

/// The aggregate of one flush interval.
#[derive(Debug)]
pub(crate) struct Batch {
    pub counters: AHashMap<SeriesKey, u64>,
    pub top: TopK,
    /// Per shard, counts per RTT bucket (the last slot is `+Inf`).
    pub rtt: AHashMap<Arc<str>, [u64; RTT_BUCKETS.len() + 1]>,
    /// Events that found no room (more than `MAX_SERIES` series).
    pub overflow: u64,
    /// Events counted in `counters`.
    pub events: u64,
}

impl Batch {
    pub fn new(top_keys: usize) -> Self {
        Self {
            counters: AHashMap::new(),
            top: TopK::new(top_keys),
            rtt: AHashMap::new(),
            overflow: 0,
            events: 0,
        }
    }

    pub fn add(&mut self, e: &Event) {
        let key = (e.tier.clone(), e.route.clone(), e.shard.clone(), e.outcome);
        if let Some(n) = self.counters.get_mut(&key) {
            *n += 1;
        } else if self.counters.len() < MAX_SERIES {
            self.counters.insert(key, 1);
        } else {
            self.overflow += 1;
            return;
        }
        self.events += 1;
        if matches!(e.outcome, Outcome::Blocked | Outcome::FallbackBlocked) {
            self.top.add(&e.identity, 1);
        }
        if let Some(rtt) = e.redis_rtt {
            let secs = rtt.as_secs_f64();
            let slot = RTT_BUCKETS
                .iter()
                .position(|le| secs <= *le)
                .unwrap_or(RTT_BUCKETS.len());
            if let Some(b) = self.rtt.get_mut(&e.shard) {
                b[slot] += 1;
            } else if self.rtt.len() < MAX_SERIES {
                let mut b = [0; RTT_BUCKETS.len() + 1];
                b[slot] = 1;
                self.rtt.insert(e.shard.clone(), b);
            }
        }
    }
}

/// Breaker trips not yet flushed, for the whole process (breakers report
/// through a free function, without a pipeline at hand).
static PENDING_TRIPS: Mutex<Vec<(String, u64)>> = Mutex::new(Vec::new());

/// Counts a breaker trip for the next flush.
pub(crate) fn pending_trip(shard: &str) {
    let mut p = PENDING_TRIPS.lock();
    if let Some(e) = p.iter_mut().find(|(s, _)| s == shard) {
        e.1 += 1;
    } else if p.len() < MAX_SERIES {
        p.push((shard.to_owned(), 1));
    }
}

/// Takes the trips counted since the last call.
pub(crate) fn take_trips() -> Vec<(String, u64)> {
    std::mem::take(&mut *PENDING_TRIPS.lock())
}

/// A batch in the wire shape shared by the Redis sink and the in-process
/// view: hash fields and counts, ready to HINCRBY / ZINCRBY.
#[derive(Debug, Default, Clone, PartialEq)]
pub(crate) struct Flat {
    /// `tier|outcome|shard|route` -> decisions.
    pub counters: Vec<(String, u64)>,
    /// identity (display form) -> blocked.
    pub top: Vec<(String, u64)>,
    /// `shard|le` -> round trips.
    pub rtt: Vec<(String, u64)>,
    /// shard -> breaker trips.
    pub trips: Vec<(String, u64)>,
    /// `version#hash` of the policy the flushing instance runs -> flushes
    /// (one per flush), so the fleet view shows which policies are in force.
    pub policies: Vec<(String, u64)>,
    /// Events the batch holds.
    pub events: u64,
}

impl Flat {
    pub fn from_batch(mut b: Batch, trips: Vec<(String, u64)>) -> Self {
        let counters = b
            .counters
            .drain()
            .map(|((tier, route, shard, outcome), n)| {
                (counter_field(&tier, outcome.as_str(), &shard, &route), n)
            })
            .collect();
        let mut rtt = Vec::new();
        for (shard, buckets) in b.rtt.drain() {
            for (i, n) in buckets.iter().enumerate() {
                if *n > 0 {
                    rtt.push((rtt_field(&shard, i), *n));
                }
            }
        }
        Self {
            counters,
            top: b.top.take(),
            rtt,
            trips,
            policies: Vec::new(),
            events: b.events,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.counters.is_empty() && self.trips.is_empty()
    }
}

/// The counter hash field. The route goes last: it is the only part that
/// may contain `|` (tier names cannot, shards are `host:port`).
pub(crate) fn counter_field(tier: &str, outcome: &str, shard: &str, route: &str) -> String {
    format!("{tier}|{outcome}|{shard}|{route}")
}

/// Splits a counter field into tier, outcome, shard, route.
pub(crate) fn parse_counter_field(f: &str) -> Option<(&str, &str, &str, &str)> {
    let mut it = f.splitn(4, '|');
    Some((it.next()?, it.next()?, it.next()?, it.next()?))
}

/// The RTT hash field for bucket `i` of a shard: `shard|le`.
pub(crate) fn rtt_field(shard: &str, i: usize) -> String {
    match RTT_BUCKETS.get(i) {
        Some(le) => format!("{shard}|{le}"),
        None => format!("{shard}|+Inf"),
    }
}

/// Splits an RTT field into shard and bucket index.
pub(crate) fn parse_rtt_field(f: &str) -> Option<(&str, usize)> {
    let (shard, le) = f.rsplit_once('|')?;
    if le == "+Inf" {
        return Some((shard, RTT_BUCKETS.len()));
    }
    let le: f64 = le.parse().ok()?;
    RTT_BUCKETS
        .iter()
        .position(|b| (b - le).abs() < 1e-12)
        .map(|i| (shard, i))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counter_and_rtt_fields_read_back_as_written_even_with_a_pipe_in_the_route() {
        let f = counter_field("free", "blocked", "127.0.0.1:7000", "/a|b/{id}");
        assert_eq!(
            parse_counter_field(&f),
            Some(("free", "blocked", "127.0.0.1:7000", "/a|b/{id}"))
        );
        for i in 0..=RTT_BUCKETS.len() {
            assert_eq!(
                parse_rtt_field(&rtt_field("10.0.0.1:6379", i)),
                Some(("10.0.0.1:6379", i))
            );
        }
    }
}
