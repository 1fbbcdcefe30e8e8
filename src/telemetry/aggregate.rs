//! What one instance gathers between two flushes: exact counters per
//! (tier, route, shard, outcome), blocked counts per (cause, identity) and
//! decisions per (tier, shard, identity) in bounded [`TopK`]s, round-trip
//! bucket counts per shard, and the worst breaker state each shard was in.
//! Everything here is bounded: label combinations are capped at
//! [`MAX_SERIES`] (the rest is dropped and counted), each top-K at
//! `top_keys`, shards at [`MAX_SERIES`].

use std::sync::Arc;

use ahash::AHashMap;
use parking_lot::Mutex;

use super::metrics::RTT_BUCKETS;
use super::{Event, Outcome, TopK};

/// Most distinct counter series (or RTT shards) one interval keeps. Labels
/// come from the policy, so a real deployment stays far below it.
pub const MAX_SERIES: usize = 4096;

use super::series::Series;

/// Units series key: tier, unit.
pub(crate) type UnitSeries = (Arc<str>, Arc<str>);

/// The aggregate of one flush interval.
#[derive(Debug)]
pub(crate) struct Batch {
    pub counters: Series,
    /// Blocked requests per `cause|identity` (see [`parse_blocked_member`]).
    pub top: TopK,
    /// Decisions per `tier|shard|identity`, blocked or not: the hot keys.
    pub hot: TopK,
    /// Per shard, counts per RTT bucket (the last slot is `+Inf`).
    pub rtt: AHashMap<Arc<str>, [u64; RTT_BUCKETS.len() + 1]>,
    /// Events that found no room (more than `MAX_SERIES` series).
    pub overflow: u64,
    /// Events counted in `counters`.
    pub events: u64,
    /// Units charged per (tier, unit), at most [`MAX_SERIES`].
    pub units: Vec<(UnitSeries, u64)>,
    /// Per unit (at most [`MAX_UNITS`]), the identities charged the most:
    /// members `tier|identity`.
    pub unit_top: Vec<(Arc<str>, TopK)>,
    top_keys: usize,
    /// Reused to build top-K members without an allocation per event.
    scratch: String,
    /// The latest run of decisions of one hot-key member, not yet in
    /// `hot`: a client deciding again and again touches the top-K once per
    /// run, not once per decision. Exact: [`Batch::settle`] adds it before
    /// `hot` is read.
    run: Run,
}

/// Consecutive decisions of one (tier, shard, identity).
#[derive(Debug, Default)]
struct Run {
    /// The labels (kept alive, so their addresses identify them).
    labels: Option<(Arc<str>, Arc<str>)>,
    identity: Arc<str>,
    count: u64,
}

impl Run {
    fn is_of(&self, e: &Event) -> bool {
        self.labels.as_ref().is_some_and(|(tier, shard)| {
            Arc::ptr_eq(tier, &e.tier)
                && Arc::ptr_eq(shard, &e.shard)
                && (Arc::ptr_eq(&self.identity, &e.identity) || self.identity == e.identity)
        })
    }
}

impl Batch {
    pub fn new(top_keys: usize) -> Self {
        Self {
            counters: Series::new(MAX_SERIES),
            top: TopK::new(top_keys),
            hot: TopK::new(top_keys),
            rtt: AHashMap::new(),
            overflow: 0,
            events: 0,
            units: Vec::new(),
            unit_top: Vec::new(),
            top_keys,
            scratch: String::new(),
            run: Run::default(),
        }
    }

    /// Adds the pending run of hot-key decisions to `hot`; call before
    /// reading `hot`.
    pub fn settle(&mut self) {
        if let Some((tier, shard)) = self.run.labels.take() {
            write_member(&mut self.scratch, &[&tier, &shard, &self.run.identity]);
            self.hot.add(&self.scratch, self.run.count);
            self.run.count = 0;
        }
    }

    pub fn add(&mut self, e: &Event) {
        if !self.counters.add_event(e) {
            self.overflow += 1;
            return;
        }
        self.events += 1;
        if let Some(cause) = block_cause(e) {
            write_member(&mut self.scratch, &[cause, &e.identity]);
            self.top.add(&self.scratch, 1);
        }
        if self.run.is_of(e) {
            self.run.count += 1;
        } else {
            self.settle();
            self.run.labels = Some((e.tier.clone(), e.shard.clone()));
            self.run.identity = e.identity.clone();
            self.run.count = 1;
        }
        for (unit, n) in e.units.iter() {
            self.add_units(&e.tier, unit, &e.identity, n);
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

impl Batch {
    /// Counts `n` units of `unit` charged to `identity` under `tier`.
    /// Labels are found by address first (the policy's strings come with
    /// every event), by content otherwise; nothing is allocated unless a
    /// series or an identity is new.
    pub fn add_units(&mut self, tier: &Arc<str>, unit: &Arc<str>, identity: &str, n: u64) {
        self.add_unit_total(tier, unit, n);
        let mut member = std::mem::take(&mut self.scratch);
        write_member(&mut member, &[tier, identity]);
        self.add_unit_member(unit, &member, n);
        self.scratch = member;
    }

    /// Adds `n` to `unit` under `tier`, if there is room for the series.
    pub fn add_unit_total(&mut self, tier: &Arc<str>, unit: &Arc<str>, n: u64) {
        if let Some((_, m)) = self
            .units
            .iter_mut()
            .find(|((t, u), _)| same(t, tier) && same(u, unit))
        {
            *m = m.saturating_add(n);
        } else if self.units.len() < MAX_SERIES {
            self.units.push(((tier.clone(), unit.clone()), n));
        }
    }

    /// Adds `n` to `member` (`tier|identity`) of `unit`'s top keys, if
    /// there is room for the unit.
    pub fn add_unit_member(&mut self, unit: &Arc<str>, member: &str, n: u64) {
        let top = match self.unit_top.iter().position(|(u, _)| same(u, unit)) {
            Some(i) => &mut self.unit_top[i].1,
            None if self.unit_top.len() < MAX_UNITS => {
                self.unit_top.push((unit.clone(), TopK::new(self.top_keys)));
                &mut self.unit_top.last_mut().expect("just pushed").1
            }
            None => return,
        };
        top.add(member, n);
    }
}

/// The same string, by address first.
fn same(a: &Arc<str>, b: &Arc<str>) -> bool {
    Arc::ptr_eq(a, b) || a == b
}

/// Most units the fleet view keeps identities for, per bucket. Units come
/// from the policy; a policy naming more keeps its totals per tier, and
/// its top keys for the first units seen.
pub const MAX_UNITS: usize = 16;

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

/// Why a request was refused, for the top-blocked table: the limit that
/// blocked it, `fail_closed` (the store could not decide and the route
/// fails closed: a refusal, not a block) or `local_fallback` (the local
/// fallback limiter blocked it while the store was away). `None` when the
/// request passed.
pub(crate) fn block_cause(e: &Event) -> Option<&str> {
    match e.outcome {
        Outcome::Blocked => Some(e.limit.as_deref().unwrap_or("limit")),
        Outcome::FallbackBlocked => Some(match e.fallback {
            Some((_, crate::policy::FailurePolicy::Local)) => "local_fallback",
            _ => FAIL_CLOSED,
        }),
        _ => None,
    }
}

/// `parts` joined by `|` into `buf` (cleared first).
fn write_member(buf: &mut String, parts: &[&str]) {
    buf.clear();
    for (i, p) in parts.iter().enumerate() {
        if i > 0 {
            buf.push('|');
        }
        buf.push_str(p);
    }
}

/// The cause of a fail-closed refusal in the top-blocked table.
pub const FAIL_CLOSED: &str = "fail_closed";

/// Splits a blocked member (`cause|identity`; causes are limit names, made
/// of letters, digits, `_` and `-`, or fixed words) into cause and
/// identity: the first `|` splits.
pub(crate) fn parse_blocked_member(m: &str) -> (&str, &str) {
    m.split_once('|').unwrap_or(("limit", m))
}

/// Between an identity's display form and the display name the app gave
/// it, in the fleet view's members: a control character, which display
/// names never hold.
const NAME_SEP: char = '\u{1f}';

/// Appends `name` (already cleaned, see
/// [`Identity::with_display_name`](crate::identity::Identity::with_display_name))
/// to an event's identity display form.
pub fn append_display_name(shown: &mut String, name: Option<&str>) {
    if let Some(name) = name {
        shown.push(NAME_SEP);
        shown.push_str(name);
    }
}

/// Splits a member's identity into its display form and display name.
pub(crate) fn split_display_name(identity: &str) -> (&str, Option<&str>) {
    match identity.rsplit_once(NAME_SEP) {
        Some((shown, name)) => (shown, Some(name)),
        None => (identity, None),
    }
}

/// Splits a hot-key member (`tier|shard|identity`: tier names and
/// `host:port` shards hold no `|`, the identity goes last) into its parts.
pub(crate) fn parse_hot_member(m: &str) -> Option<(&str, &str, &str)> {
    let mut it = m.splitn(3, '|');
    Some((it.next()?, it.next()?, it.next()?))
}

/// Each shard's breaker: its state now and the worst state since the last
/// flush, so an open interval shorter than a flush still shows.
static BREAKERS: Mutex<Vec<(String, u8, u8)>> = Mutex::new(Vec::new());

/// Notes a shard's breaker state (0 closed, 1 half-open, 2 open).
pub(crate) fn note_breaker_state(shard: &str, state: u8) {
    let mut b = BREAKERS.lock();
    if let Some(e) = b.iter_mut().find(|(s, _, _)| s == shard) {
        e.1 = state;
        e.2 = e.2.max(state);
    } else if b.len() < MAX_SERIES {
        b.push((shard.to_owned(), state, state));
    }
}

/// The breaker fields of one flush (`shard|state` -> 1, the worst state
/// since the last flush), then starts the next interval from the states
/// held now.
pub(crate) fn take_breakers() -> Vec<(String, u64)> {
    let mut b = BREAKERS.lock();
    b.iter_mut()
        .map(|(shard, now, worst)| {
            let field = breaker_field(shard, std::mem::replace(worst, *now));
            (field, 1)
        })
        .collect()
}

/// Names of the gauge values, in gauge order.
pub(crate) const BREAKER_STATES: [&str; 3] = ["closed", "half_open", "open"];

fn breaker_field(shard: &str, state: u8) -> String {
    let name = BREAKER_STATES
        .get(usize::from(state))
        .copied()
        .unwrap_or("open");
    format!("{shard}|{name}")
}

/// Splits a breaker field into shard and gauge value.
pub(crate) fn parse_breaker_field(f: &str) -> Option<(&str, u8)> {
    let (shard, state) = f.rsplit_once('|')?;
    let i = BREAKER_STATES.iter().position(|s| *s == state)?;
    Some((shard, i as u8))
}

/// A batch in the wire shape shared by the Redis sink and the in-process
/// view: hash fields and counts, ready to HINCRBY / ZINCRBY.
#[derive(Debug, Default, Clone, PartialEq)]
pub(crate) struct Flat {
    /// `tier|outcome|shard|route` -> decisions.
    pub counters: Vec<(String, u64)>,
    /// `cause|identity` (display form) -> blocked.
    pub top: Vec<(String, u64)>,
    /// `tier|shard|identity` -> decisions.
    pub hot: Vec<(String, u64)>,
    /// `shard|le` -> round trips.
    pub rtt: Vec<(String, u64)>,
    /// shard -> breaker trips.
    pub trips: Vec<(String, u64)>,
    /// `shard|state` -> instance flushes that saw it (worst state per
    /// flush interval).
    pub breakers: Vec<(String, u64)>,
    /// `version#hash` of the policy the flushing instance runs -> flushes
    /// (one per flush), so the fleet view shows which policies are in force.
    pub policies: Vec<(String, u64)>,
    /// Flushing instance -> events it flushed, so the fleet view says which
    /// instances reported.
    pub instances: Vec<(String, u64)>,
    /// Flushing instance -> when it flushed (Unix seconds); merged by
    /// maximum, never summed.
    pub reported: Vec<(String, u64)>,
    /// `tier|unit` -> units admitted decisions were charged.
    pub units: Vec<(String, u64)>,
    /// `unit|tier|identity` -> units charged, at most the table's keep per
    /// unit (see [`keep_top_per_unit`]).
    pub unit_keys: Vec<(String, u64)>,
    /// Events the batch holds.
    pub events: u64,
}

impl Flat {
    pub fn from_batch(
        mut b: Batch,
        trips: Vec<(String, u64)>,
        breakers: Vec<(String, u64)>,
    ) -> Self {
        b.settle();
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
        let units = b
            .units
            .drain(..)
            .map(|((tier, unit), n)| (unit_field(&tier, &unit), n))
            .collect();
        let mut unit_keys = Vec::new();
        for (unit, mut top) in b.unit_top.drain(..) {
            for (member, n) in top.take() {
                unit_keys.push((format!("{unit}|{member}"), n));
            }
        }
        Self {
            units,
            unit_keys,
            counters,
            top: b.top.take(),
            hot: b.hot.take(),
            rtt,
            trips,
            breakers,
            policies: Vec::new(),
            instances: Vec::new(),
            reported: Vec::new(),
            events: b.events,
        }
    }

    /// Nothing worth a write: no decision, no trip, and every breaker
    /// closed (a closed breaker without traffic says nothing new).
    pub fn is_empty(&self) -> bool {
        self.counters.is_empty()
            && self.trips.is_empty()
            && self
                .breakers
                .iter()
                .all(|(f, _)| parse_breaker_field(f).is_none_or(|(_, s)| s == 0))
    }
}

/// The counter hash field. The route goes last: it is the only part that
/// may contain `|` (tier names cannot, shards are `host:port`).
pub(crate) fn counter_field(tier: &str, outcome: &str, shard: &str, route: &str) -> String {
    format!("{tier}|{outcome}|{shard}|{route}")
}

/// Splits a counter field into tier, outcome, shard, route.
/// The fleet view's field of `unit` charged under `tier`.
pub(crate) fn unit_field(tier: &str, unit: &str) -> String {
    format!("{tier}|{unit}")
}

/// `(tier, unit)` of a [`unit_field`]; unit names hold no `|`.
pub(crate) fn parse_unit_field(f: &str) -> Option<(&str, &str)> {
    f.rsplit_once('|')
}

/// `(unit, tier, identity)` of a `unit_keys` member.
pub(crate) fn parse_unit_member(m: &str) -> Option<(&str, &str, &str)> {
    let mut it = m.splitn(3, '|');
    Some((it.next()?, it.next()?, it.next()?))
}

/// Keeps, for each unit of `table` (members `unit|...`), its `keep`
/// highest members, as a per-unit zset trimmed to `keep` would.
pub(crate) fn keep_top_per_unit(table: &mut Vec<(String, u64)>, keep: usize) {
    table.sort_by(|x, y| {
        let ux = x.0.split('|').next();
        let uy = y.0.split('|').next();
        ux.cmp(&uy).then(y.1.cmp(&x.1)).then_with(|| x.0.cmp(&y.0))
    });
    let mut run: Option<(String, usize)> = None;
    table.retain(|(m, _)| {
        let unit = m.split('|').next().unwrap_or_default();
        match &mut run {
            Some((u, n)) if u == unit => {
                *n += 1;
                *n <= keep
            }
            _ => {
                run = Some((unit.to_owned(), 1));
                true
            }
        }
    });
}

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
    fn hot_keys_count_every_decision_exactly_whether_runs_are_long_or_interleaved() {
        let (free, pro, memory) = (Arc::from("free"), Arc::from("pro"), Arc::from("memory"));
        let event = |tier: &Arc<str>, identity: &str| Event {
            tier: tier.clone(),
            route: Arc::from("*"),
            limit: None,
            exceeded: Vec::new(),
            outcome: Outcome::Allowed,
            shard: Arc::clone(&memory),
            identity: identity.into(),
            cost: 1,
            units: Default::default(),
            redis_rtt: None,
            fallback: None,
        };
        let mut b = Batch::new(10);
        for _ in 0..5 {
            b.add(&event(&free, "a"));
        }
        for i in 0..6 {
            b.add(&event(&free, if i % 2 == 0 { "a" } else { "b" }));
        }
        // The same identity in another tier is another member.
        b.add(&event(&pro, "a"));
        b.add(&event(&free, "a"));
        let flat = Flat::from_batch(b, Vec::new(), Vec::new());
        let mut hot = flat.hot;
        hot.sort();
        assert_eq!(
            hot,
            vec![
                ("free|memory|a".to_owned(), 9),
                ("free|memory|b".to_owned(), 3),
                ("pro|memory|a".to_owned(), 1),
            ]
        );
    }

    #[test]
    fn units_sum_per_tier_and_each_unit_keeps_its_own_top_keys() {
        let (free, memory) = (Arc::from("free"), Arc::from("memory"));
        let event = |identity: &str, units: crate::telemetry::UnitsCharged| Event {
            tier: Arc::clone(&free),
            route: Arc::from("*"),
            limit: None,
            exceeded: Vec::new(),
            outcome: Outcome::Allowed,
            shard: Arc::clone(&memory),
            identity: identity.into(),
            cost: 1,
            units,
            redis_rtt: None,
            fallback: None,
        };
        let charged = |tokens, requests| {
            crate::telemetry::UnitsCharged::new()
                .with("tokens", tokens)
                .with("requests", requests)
        };
        let mut b = Batch::new(1);
        b.add(&event("a", charged(1000, 1)));
        b.add(&event("b", charged(10, 1)));
        b.add(&event("b", charged(10, 1)));
        b.add(&event("c", Default::default()));
        let mut flat = Flat::from_batch(b, Vec::new(), Vec::new());
        flat.units.sort();
        assert_eq!(
            flat.units,
            vec![
                ("free|requests".to_owned(), 3),
                ("free|tokens".to_owned(), 1020)
            ]
        );
        // One key kept per unit: a's tokens do not crowd b's requests out.
        let mut keys = flat.unit_keys.clone();
        keys.sort();
        assert_eq!(keys.len(), 2, "{keys:?}");
        assert!(keys[0].0.starts_with("requests|free|"), "{keys:?}");
        assert!(keys[1].0.starts_with("tokens|free|"), "{keys:?}");
        let mut table = vec![
            ("tokens|free|a".to_owned(), 5),
            ("tokens|free|b".to_owned(), 9),
            ("requests|free|a".to_owned(), 1),
            ("requests|free|b".to_owned(), 2),
        ];
        keep_top_per_unit(&mut table, 1);
        table.sort();
        assert_eq!(
            table,
            vec![
                ("requests|free|b".to_owned(), 2),
                ("tokens|free|b".to_owned(), 9)
            ]
        );
    }

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
