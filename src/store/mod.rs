//! Stores: where counters live and where a request's limits are decided,
//! together and atomically, in one call.
//!
//! - [`MemoryStore`]: in process, sharded, TTL-evicted, capped at
//!   `max_entries` (the embedded default).
//! - `RedisStore` / `ClusterStore` / `SentinelStore` (feature
//!   `redis-store`): one EVALSHA of the `lua/` scripts per request, on the
//!   Redis clock; `rediss://` with the feature `tls`.
//!
//! ```
//! # tokio_test_block_on(async {
//! use ratewatch::algorithm::Algorithm;
//! use ratewatch::store::{Batch, Item, MemoryStore, Store};
//! let store = MemoryStore::new();
//! let items = [Item::new("rw:{free:abc}:burst", Algorithm::TokenBucket { capacity: 1, refill_per_second: 1.0 })];
//! let first = store.decide(&Batch::consume(&items, 1)).await.unwrap();
//! let second = store.decide(&Batch::consume(&items, 1)).await.unwrap();
//! assert!(first.allowed && !second.allowed);
//! # });
//! # fn tokio_test_block_on<F: std::future::Future>(f: F) -> F::Output {
//! #     tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(f)
//! # }
//! ```

mod charge;
#[cfg(feature = "redis-store")]
mod cluster;
mod error;
pub mod keys;
mod memory;
#[cfg(feature = "redis-store")]
mod redis;
#[cfg(feature = "redis-store")]
mod script;
#[cfg(feature = "redis-store")]
mod sentinel;
mod settle;
mod usage;

use std::sync::Arc;
use std::time::Duration;

pub use charge::Charge;
pub use error::{ErrorClass, StoreError};
pub use memory::MemoryStore;
pub use settle::Settle;
pub use usage::ShardUsage;

#[cfg(feature = "redis-store")]
pub use self::redis::{DEFAULT_URL as DEFAULT_REDIS_URL, RedisStore};
#[cfg(feature = "redis-store")]
pub use cluster::{ClusterStore, slot_of};
#[cfg(feature = "redis-store")]
pub use sentinel::SentinelStore;

use crate::algorithm::{Algorithm, Verdict};
use crate::clock::{Clock, Micros};
use crate::policy::{StoreKind, StoreSettings};

/// One limit to decide: its full key and its algorithm.
#[derive(Debug, Clone, PartialEq)]
pub struct Item {
    /// The store key (see [`keys`] for the schema), shared: the limiter
    /// hands a client's run of decisions one key it built once.
    pub key: Arc<str>,
    /// The algorithm with its (already scaled) parameters.
    pub algorithm: Algorithm,
    /// A shadow limit is decided and reported but never blocks.
    pub shadow: bool,
    /// Units this limit is asked for instead of the batch's cost (`Some(0)`
    /// checks it without charging it), so limits of different groups of
    /// one request (the descriptors of a rate limit service request) are
    /// decided in one call at their own costs. Ignored when peeking.
    pub cost: Option<u64>,
    /// Asked for 0 units, the limit still refuses once nothing is left: it
    /// is decided as if asked for one unit and charged nothing. A request
    /// that names no cost in a limit's unit ("check now, charge later") is
    /// refused once that unit is used up. Ignored for a cost above 0, when
    /// peeking, and by in-flight limits.
    pub require_left: bool,
}

impl Item {
    /// An enforced limit on `key`.
    pub fn new(key: impl Into<Arc<str>>, algorithm: Algorithm) -> Self {
        Self {
            key: key.into(),
            algorithm,
            shadow: false,
            cost: None,
            require_left: false,
        }
    }

    /// The same limit asked for `cost` units whatever the batch's cost.
    pub fn with_cost(mut self, cost: u64) -> Self {
        self.cost = Some(cost);
        self
    }

    /// The same limit asked for 0 units, refusing once nothing is left
    /// ([`Item::require_left`]).
    pub fn checking_left(mut self) -> Self {
        self.cost = Some(0);
        self.require_left = true;
        self
    }
}

/// All limits of one request, decided together.
#[derive(Debug, Clone, Copy)]
pub struct Batch<'a> {
    /// The limits.
    pub items: &'a [Item],
    /// Units the request consumes from each limit.
    pub cost: u64,
    /// Report quota without consuming anything.
    pub peek: bool,
    /// Decide at this time instead of the store's clock (tests).
    pub now: Option<Micros>,
    /// The id in-flight limits hold their slot under when the request is
    /// admitted (unique per request and process, see [`holder_id`]);
    /// without one an in-flight limit is checked and nothing is taken.
    pub holder: Option<&'a str>,
}

impl<'a> Batch<'a> {
    /// A request consuming `cost` from every limit.
    pub fn consume(items: &'a [Item], cost: u64) -> Self {
        Self {
            items,
            cost,
            peek: false,
            now: None,
            holder: None,
        }
    }

    /// A look at every limit that consumes nothing.
    pub fn peek(items: &'a [Item]) -> Self {
        Self {
            items,
            cost: 0,
            peek: true,
            now: None,
            holder: None,
        }
    }

    /// Takes the in-flight slots of the batch as `holder` (see
    /// [`holder_id`]): released with [`Store::release`].
    pub fn holding(mut self, holder: &'a str) -> Self {
        self.holder = Some(holder);
        self
    }

    /// Decides at `now` rather than on the store's clock.
    pub fn at(mut self, now: Micros) -> Self {
        self.now = Some(now);
        self
    }

    /// The cost each algorithm is asked about (0 when peeking), unless
    /// the item names its own ([`Batch::cost_of`]).
    pub fn effective_cost(&self) -> u64 {
        if self.peek { 0 } else { self.cost }
    }

    /// The cost `item` is asked about: its own if it has one, else the
    /// batch's; 0 when peeking.
    pub fn cost_of(&self, item: &Item) -> u64 {
        if self.peek {
            0
        } else {
            item.cost.unwrap_or(self.cost)
        }
    }

    /// Whether `item` is decided as a check that something is left (see
    /// [`Item::require_left`]): asked for 0 units, not peeking, not an
    /// in-flight limit.
    pub fn checks_left(&self, item: &Item) -> bool {
        item.require_left
            && !self.peek
            && self.cost_of(item) == 0
            && !item.algorithm.is_concurrency()
    }

    /// `item`'s algorithm applied to `state` at `now` for this batch: at
    /// its cost, or, for a check that something is left
    /// ([`Batch::checks_left`]), at one unit with nothing to write and that
    /// unit counted as remaining.
    pub fn step(
        &self,
        item: &Item,
        state: Option<&crate::algorithm::State>,
        now: Micros,
    ) -> crate::algorithm::Step {
        if !self.checks_left(item) {
            return item
                .algorithm
                .decide_as(state, now, self.cost_of(item), self.holder);
        }
        let mut step = item.algorithm.decide_as(state, now, 1, self.holder);
        if step.verdict.allowed {
            step.verdict.remaining += 1.0;
            step.verdict.delay_us = 0;
            step.state = None;
        }
        step
    }

    /// Whether some item of the batch names its own cost (and the batch
    /// charges at all).
    pub fn has_item_costs(&self) -> bool {
        !self.peek && self.items.iter().any(|i| i.cost.is_some())
    }

    /// [`uncharge`] for this batch's items at each one's own cost. A key
    /// repeated in the batch was decided on what its earlier admitted
    /// copies charged, so each admitted copy gets back those charges too:
    /// every copy then reports the state the refused request left.
    pub fn uncharge(&self, verdicts: &mut [Verdict]) {
        for i in 0..self.items.len().min(verdicts.len()) {
            let item = &self.items[i];
            let earlier: u64 = (0..i)
                .filter(|&j| self.items[j].key == item.key && verdicts[j].allowed)
                .map(|j| self.cost_of(&self.items[j]))
                .fold(0, u64::saturating_add);
            uncharge(
                std::slice::from_ref(item),
                std::slice::from_mut(&mut verdicts[i]),
                self.cost_of(item).saturating_add(earlier),
            );
        }
    }
}

/// One verdict per item of a batch: inline for one or two limits, so a
/// decision allocates nothing for them.
pub type Verdicts = smallvec::SmallVec<[Verdict; 2]>;

/// A store's answer for a batch.
#[derive(Debug, Clone, PartialEq)]
pub struct StoreDecision {
    /// Whether every enforced limit admitted the request (then all were charged).
    pub allowed: bool,
    /// One verdict per item, in order. When the request was blocked, the
    /// `remaining` of limits that would have admitted it is uncharged.
    pub verdicts: Verdicts,
    /// The node that decided: `memory` or a Redis `host:port`.
    pub shard: Arc<str>,
    /// The time the store reported deciding at.
    pub now: Micros,
    /// Round-trip time to Redis, if any.
    pub rtt: Option<Duration>,
}

/// Where counters live. One call decides every limit of a request, all or
/// nothing: either every enforced limit admits and all are charged, or
/// nothing is written.
#[async_trait::async_trait]
pub trait Store: Send + Sync + 'static {
    /// Decides (or, with [`Batch::peek`], reports) all limits of a request.
    async fn decide(&self, batch: &Batch<'_>) -> Result<StoreDecision, StoreError>;

    /// [`Store::decide`] for a caller that bounds the call itself (a
    /// timeout around it, as the limiter's decision budget is): a store may
    /// then leave out a timer of its own, one fewer per decision. A caller
    /// that does not bound the call must use [`Store::decide`]. The default
    /// is [`Store::decide`].
    async fn decide_bounded(&self, batch: &Batch<'_>) -> Result<StoreDecision, StoreError> {
        self.decide(batch).await
    }

    /// Decides `batch` here and now, without a future, if this store never
    /// waits (the memory store); `None` (the default) sends the batch to
    /// [`Store::decide`]. The limiter asks a store without breakers this
    /// first, so the layer can answer from `call` with no boxed future.
    fn decide_sync(&self, batch: &Batch<'_>) -> Option<Result<StoreDecision, StoreError>> {
        let _ = batch;
        None
    }

    /// The shard that would decide `key` (for breakers and labels).
    fn shard_for(&self, key: &str) -> Arc<str>;

    /// `memory`, `redis`, `redis-cluster` or `redis-sentinel`.
    fn kind(&self) -> &'static str;

    /// Whether [`Store::probe`] really checks a shard. Breakers of a store
    /// that probes close only on a probe's success, never on a request's.
    fn probes(&self) -> bool {
        false
    }

    /// The half-open probe of `shard`'s breaker: proves, on a fresh
    /// connection and without any client's request, that `shard` decides
    /// again (the decide script runs, reloaded after `NOSCRIPT`, on a
    /// throwaway key), and makes that connection the one later decisions
    /// use. The default checks nothing.
    async fn probe(&self, shard: &Arc<str>) -> Result<(), StoreError> {
        let _ = shard;
        Ok(())
    }

    /// Whether this store can charge a lease and take its unspent part back
    /// ([`Store::decide_charged`], [`Store::give_back`]). Without it every
    /// request is decided exactly.
    fn leases(&self) -> bool {
        false
    }

    /// Decides like [`Store::decide`] and, when the batch was admitted and
    /// charged, returns the receipt [`Store::give_back`] needs.
    async fn decide_charged(
        &self,
        batch: &Batch<'_>,
    ) -> Result<(StoreDecision, Option<Charge>), StoreError> {
        Ok((self.decide(batch).await?, None))
    }

    /// Gives `units` of what `charge` (from a decision on `items`) charged
    /// back to every limit: tokens back into a bucket, a window counter
    /// down if it is still the window charged, a GCRA's TAT back. Never
    /// more than was charged; a window that rolled keeps nothing to give.
    async fn give_back(
        &self,
        items: &[Item],
        charge: &Charge,
        units: u64,
    ) -> Result<(), StoreError> {
        let _ = (items, charge, units);
        Ok(())
    }

    /// Charges or gives back a settle's units ([`crate::algorithm::settle`])
    /// on every limit of `settle`, atomically per shard (per slot on a
    /// cluster): the request's actual usage after its response. A store
    /// that cannot settle (the default) answers an error, which the
    /// limiter counts as a failed settle.
    async fn settle(&self, settle: &Settle<'_>) -> Result<(), StoreError> {
        let _ = settle;
        Err(StoreError::Command(format!(
            "the {} store cannot settle",
            self.kind()
        )))
    }

    /// Gives back the in-flight slots `holder` holds on `items` (the
    /// in-flight items of the decision that took them). Idempotent: a slot
    /// already gone (released, expired) is no error.
    async fn release(&self, items: &[Item], holder: &str) -> Result<(), StoreError> {
        let _ = (items, holder);
        Ok(())
    }

    /// [`Store::release`] here and now, if this store never waits (the
    /// memory store); `None` (the default) sends it to [`Store::release`].
    fn release_sync(&self, items: &[Item], holder: &str) -> Option<Result<(), StoreError>> {
        let _ = (items, holder);
        None
    }

    /// Pushes the deadline of `holder`'s slots on `items` to a full hold
    /// timeout from now (on the store's clock). Returns how many of them
    /// were already gone (expired or released): those are not taken again.
    async fn renew(&self, items: &[Item], holder: &str) -> Result<u64, StoreError> {
        let _ = (items, holder);
        Ok(0)
    }

    /// Keys and memory per shard now, for the `ratewatch_store_*` gauges.
    /// Called off the request path; a shard that cannot answer is left
    /// out. The default knows nothing.
    async fn usage(&self) -> Vec<ShardUsage> {
        Vec::new()
    }

    /// Tells the store whom to report to besides its decisions (script
    /// reloads, evictions). A store with nothing to report ignores it.
    fn observe(&self, observer: Arc<dyn StoreObserver>) {
        let _ = observer;
    }
}

/// Hears what a store does besides deciding, so that telemetry can count it
/// while the store knows nothing of telemetry. Calls come from the decision
/// path: they must be cheap and never block.
pub trait StoreObserver: Send + Sync + 'static {
    /// The Lua scripts were loaded again on `shard` after `NOSCRIPT`.
    fn script_reloaded(&self, shard: &str) {
        let _ = shard;
    }

    /// `n` live entries of `shard` were evicted to stay under the memory
    /// store's entry cap: each is a counter reset. Called with `n = 0` when
    /// a store starts reporting, so the count exists from the start.
    fn evicted(&self, shard: &str, n: u64) {
        let _ = (shard, n);
    }

    /// `n` in-flight holders of `shard` were dropped past their deadline
    /// (a holder that neither released nor renewed: a crashed process).
    fn holders_expired(&self, shard: &str, n: u64) {
        let _ = (shard, n);
    }
}

/// A new holder id for the in-flight slots of one request: a random
/// per-process part and a counter, so ids never repeat across processes
/// and never carry anything of the caller (no key, no identity).
///
/// The random part is mixed with the process id on every call: a process
/// forked after its first id inherits the random number and the counter,
/// and would otherwise make its parent's next ids.
pub fn holder_id() -> String {
    use std::sync::OnceLock;
    use std::sync::atomic::{AtomicU64, Ordering};
    static PROCESS: OnceLock<u64> = OnceLock::new();
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let process = *PROCESS.get_or_init(rand::random::<u64>) ^ u64::from(std::process::id());
    holder_text(process, NEXT.fetch_add(1, Ordering::Relaxed))
}

/// `{process:016x}:{n}`, written without the formatter: a holder id is
/// made for every request a concurrency limit admits.
fn holder_text(process: u64, n: u64) -> String {
    let mut id = String::with_capacity(16 + 1 + 20);
    id.extend(
        (0..16)
            .rev()
            .map(|i| HEX[(process >> (i * 4)) as usize & 0xf] as char),
    );
    id.push(':');
    crate::decimal::push_u64(&mut id, n);
    id
}

const HEX: &[u8; 16] = b"0123456789abcdef";

/// Opens the store `settings` names. A Redis that is down does not fail
/// this; only invalid settings do.
pub async fn open(
    settings: &StoreSettings,
    clock: Arc<dyn Clock>,
) -> Result<Arc<dyn Store>, StoreError> {
    match settings.kind {
        StoreKind::Memory => Ok(Arc::new(
            MemoryStore::with_clock(clock).with_max_entries(settings.max_entries),
        )),
        #[cfg(feature = "redis-store")]
        StoreKind::Redis => Ok(Arc::new(RedisStore::connect(settings).await?)),
        #[cfg(feature = "redis-store")]
        StoreKind::RedisCluster => Ok(Arc::new(ClusterStore::connect(settings).await?)),
        #[cfg(feature = "redis-store")]
        StoreKind::RedisSentinel => Ok(Arc::new(SentinelStore::connect(settings).await?)),
        #[cfg(not(feature = "redis-store"))]
        kind => Err(StoreError::Unavailable(format!(
            "this build of ratewatch has no {} store (feature `redis-store`)",
            kind.as_str()
        ))),
    }
}

/// Whether every enforced verdict admits.
pub fn all_enforced_allow(items: &[Item], verdicts: &[Verdict]) -> bool {
    items
        .iter()
        .zip(verdicts)
        .all(|(item, v)| item.shadow || v.allowed)
}

/// Applies the all-or-nothing rule to the verdicts of a blocked request:
/// limits that would have admitted it were not charged, so their remaining
/// goes back up by the cost.
pub fn uncharge(items: &[Item], verdicts: &mut [Verdict], cost: u64) {
    for (item, v) in items.iter().zip(verdicts.iter_mut()) {
        if v.allowed {
            v.remaining += cost as f64;
            let quota = item.algorithm.quota() as f64;
            if v.remaining > quota {
                v.remaining = quota;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_holder_id_reads_as_the_formatter_writes_it() {
        for process in [0, 1, 0xabc, 0x0123_4567_89ab_cdef, u64::MAX] {
            for n in [0, 7, 10, 99, 100, 12_345, u64::from(u32::MAX), u64::MAX] {
                assert_eq!(
                    super::holder_text(process, n),
                    format!("{process:016x}:{n}")
                );
            }
        }
    }
}
