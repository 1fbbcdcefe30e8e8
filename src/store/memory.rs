//! The in-process store: sharded maps behind short locks, no global lock,
//! a hard cap on live entries.
//!
//! A request's keys may live in several shards; their locks are taken in
//! shard order (so two requests cannot deadlock), every limit is decided,
//! and only if all admit are the new states written.
//!
//! Memory stays bounded whatever clients invent:
//! - An entry is a 128-bit keyed hash of its key (no allocation per key:
//!   about 100 bytes an entry, and a swept map gives all of it back) and
//!   its state, with its expiry. Entries carry their expiry. A shard drops expired entries when it has
//!   doubled in size since its last sweep (amortised O(1) per insert), when
//!   a decision touches it and its last sweep is more than 10 s old, and, inside a tokio runtime, from a background
//!   task at that interval, so an idle store empties too. A sweep that
//!   leaves a map mostly empty shrinks it: a spike's memory is given back.
//! - Each shard holds at most its share of `max_entries`. A shard that is
//!   full evicts its live entries closest to expiry first (the ones whose
//!   loss resets the least), a small batch at a time so that finding them
//!   costs amortised O(1) per insert. Every eviction is a counter reset: the
//!   store counts them ([`MemoryStore::evictions`]) and reports them to its
//!   [`StoreObserver`].

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use parking_lot::{Mutex, MutexGuard, RwLock};
use smallvec::SmallVec;

use super::{Batch, Store, StoreDecision, StoreError, StoreObserver, all_enforced_allow, uncharge};
use crate::algorithm::{State, Step, concurrency};
use crate::clock::{Clock, MICROS_PER_SEC, Micros, SystemClock};
use crate::policy::DEFAULT_MAX_ENTRIES;

const SHARDS: usize = 64;
const MIN_SWEEP_LEN: usize = 1024;
/// A shard is swept at least this often (µs) while decisions touch it, and
/// every shard this often by the background task.
const SWEEP_INTERVAL_US: u64 = 10 * MICROS_PER_SEC;
/// A full shard evicts 1/EVICT_BATCH of its cap at once (at least one):
/// finding them takes two passes over the shard, so a batch of 1/16 costs
/// about 32 entry visits per insert (128 at 1/64) and leaves a full shard
/// 94% full.
const EVICT_BATCH: usize = 16;

struct Entry {
    state: State,
    expires_at: Micros,
}

/// A store key as the maps hold it: two independent 64-bit keyed hashes.
/// Keys cannot be chosen to collide without the process's random seeds, and
/// 2 million live entries collide by chance with odds of about 1e-26.
type Key = u128;

struct Shard {
    map: HashMap<Key, Entry, ahash::RandomState>,
    sweep_at_len: usize,
    swept_at: Micros,
    /// Most entries this shard may hold.
    cap: usize,
}

impl Shard {
    fn new(cap: usize) -> Self {
        Self {
            map: HashMap::default(),
            sweep_at_len: MIN_SWEEP_LEN,
            swept_at: 0,
            cap,
        }
    }

    fn live(&self, key: Key, now: Micros) -> Option<&State> {
        self.map
            .get(&key)
            .filter(|e| e.expires_at > now)
            .map(|e| &e.state)
    }

    /// Drops expired entries; a map left mostly empty gives memory back.
    fn sweep(&mut self, now: Micros) {
        self.map.retain(|_, e| e.expires_at > now);
        self.sweep_at_len = (self.map.len() * 2).max(MIN_SWEEP_LEN);
        self.swept_at = now;
        let len = self.map.len();
        if self.map.capacity() > MIN_SWEEP_LEN && self.map.capacity() > 4 * len {
            self.map.shrink_to(len * 2);
        }
    }

    /// Makes room for `need` new entries under the cap: expired entries go
    /// first, then the live entries closest to expiry, at least a batch of
    /// them so that the scan is paid once per batch. Returns how many live
    /// entries were evicted.
    fn make_room(&mut self, need: usize, now: Micros) -> u64 {
        if self.map.len() + need <= self.cap {
            return 0;
        }
        self.sweep(now);
        let len = self.map.len();
        if len + need <= self.cap {
            return 0;
        }
        let batch = (self.cap / EVICT_BATCH).max(1);
        let evict = (len + need - self.cap).max(batch).min(len);
        if evict == 0 {
            // An empty shard asked for more than it may hold: nothing to evict.
            return 0;
        }
        let mut expiries: Vec<Micros> = self.map.values().map(|e| e.expires_at).collect();
        let (_, &mut threshold, _) = expiries.select_nth_unstable(evict - 1);
        // Everything expiring before the threshold goes, and as many of
        // those expiring exactly at it as make up the count.
        let before = expiries.iter().filter(|&&t| t < threshold).count();
        let mut at_threshold = evict - before;
        self.map.retain(|_, e| {
            if e.expires_at < threshold {
                false
            } else if e.expires_at == threshold && at_threshold > 0 {
                at_threshold -= 1;
                false
            } else {
                true
            }
        });
        evict as u64
    }

    fn put(&mut self, key: Key, state: State, expires_at: Micros, now: Micros) {
        match self.map.get_mut(&key) {
            Some(e) => {
                e.state = state;
                e.expires_at = expires_at;
            }
            None => {
                self.map.insert(key, Entry { state, expires_at });
                if self.map.len() > self.sweep_at_len {
                    self.sweep(now);
                }
            }
        }
    }
}

/// Who hears about evictions; shared by clones of a store.
type Observer = Arc<RwLock<Option<Arc<dyn StoreObserver>>>>;

/// The in-process store. Cheap to clone; clones share counters.
#[derive(Clone)]
pub struct MemoryStore {
    shards: Arc<[Mutex<Shard>]>,
    hashers: (ahash::RandomState, ahash::RandomState),
    clock: Arc<dyn Clock>,
    shard_label: Arc<str>,
    max_entries: usize,
    evictions: Arc<AtomicU64>,
    observer: Observer,
}

impl std::fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryStore")
            .field("keys", &self.len())
            .field("max_entries", &self.max_entries)
            .finish()
    }
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryStore {
    /// A store on the system clock, capped at [`DEFAULT_MAX_ENTRIES`].
    pub fn new() -> Self {
        Self::with_clock(Arc::new(SystemClock))
    }

    /// A store on `clock` (a `ManualClock` in tests).
    pub fn with_clock(clock: Arc<dyn Clock>) -> Self {
        Self::with_clock_and_label(clock, "memory")
    }

    /// A store whose decisions name `label` as their shard (the local
    /// fallback labels itself apart from the primary memory store).
    pub fn with_clock_and_label(clock: Arc<dyn Clock>, label: &str) -> Self {
        Self::build(clock, label.into(), DEFAULT_MAX_ENTRIES, SHARDS)
    }

    /// The same store with at most `max_entries` live entries (at least one
    /// per shard). Call before the first decision: the shards start empty.
    pub fn with_max_entries(self, max_entries: usize) -> Self {
        let shards = self.shards.len();
        Self::build(self.clock, self.shard_label, max_entries, shards)
    }

    /// The same store with `shards` shards (at least one). Each shard holds
    /// `max_entries / shards` and evicts on its own: one shard makes the
    /// eviction order exact, many make locks short. Call before the first
    /// decision: the shards start empty.
    pub fn with_shards(self, shards: usize) -> Self {
        Self::build(self.clock, self.shard_label, self.max_entries, shards)
    }

    fn build(clock: Arc<dyn Clock>, label: Arc<str>, max_entries: usize, shards: usize) -> Self {
        let shards = shards.max(1);
        let cap = (max_entries / shards).max(1);
        let store = Self {
            shards: (0..shards)
                .map(|_| Mutex::new(Shard::new(cap)))
                .collect::<Vec<_>>()
                .into(),
            hashers: (ahash::RandomState::new(), ahash::RandomState::new()),
            clock,
            shard_label: label,
            max_entries,
            evictions: Arc::new(AtomicU64::new(0)),
            observer: Arc::new(RwLock::new(None)),
        };
        store.spawn_sweeper();
        store
    }

    /// Inside a tokio runtime, sweeps every shard each `SWEEP_INTERVAL_US`
    /// until the store is dropped, so that an idle
    /// store gives its memory back too.
    fn spawn_sweeper(&self) {
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let shards: Weak<[Mutex<Shard>]> = Arc::downgrade(&self.shards);
        let clock = self.clock.clone();
        rt.spawn(async move {
            let every = std::time::Duration::from_micros(SWEEP_INTERVAL_US);
            let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
            loop {
                tick.tick().await;
                let Some(shards) = shards.upgrade() else {
                    return;
                };
                for s in shards.iter() {
                    let now = clock.now_us();
                    s.lock().sweep(now);
                }
            }
        });
    }

    /// Keys currently held, live or expired but not yet swept.
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().map.len()).sum()
    }

    /// Whether no key is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Entries the maps have room for without growing: what the store's
    /// memory is sized for, which drops again after a spike is swept.
    pub fn capacity(&self) -> usize {
        self.shards.iter().map(|s| s.lock().map.capacity()).sum()
    }

    /// The most live entries the store holds.
    pub fn max_entries(&self) -> usize {
        self.max_entries
    }

    /// Live entries evicted so far to stay under the cap.
    pub fn evictions(&self) -> u64 {
        self.evictions.load(Ordering::Relaxed)
    }

    /// Drops every expired key now (and gives back what the maps no longer need).
    pub fn sweep(&self) {
        let now = self.clock.now_us();
        for s in self.shards.iter() {
            s.lock().sweep(now);
        }
    }

    /// Drops every key.
    pub fn clear(&self) {
        for s in self.shards.iter() {
            let mut s = s.lock();
            s.map = HashMap::default();
            s.sweep_at_len = MIN_SWEEP_LEN;
        }
    }

    /// The shard and the map key of a store key.
    fn locate(&self, key: &str) -> (usize, Key) {
        let high = self.hashers.0.hash_one(key);
        let low = self.hashers.1.hash_one(key);
        (
            (high as usize) % self.shards.len(),
            (u128::from(high) << 64) | u128::from(low),
        )
    }

    /// Decides a batch synchronously (the store never awaits).
    ///
    /// A request has a few limits: their shards, guards and steps live on
    /// the stack, so a decision allocates only the verdicts it returns.
    pub fn decide_now(&self, batch: &Batch<'_>) -> StoreDecision {
        let now = batch.now.unwrap_or_else(|| self.clock.now_us());
        if let [item] = batch.items {
            return self.decide_one(item, batch, now);
        }
        let located: Few<(usize, Key)> = batch.items.iter().map(|i| self.locate(&i.key)).collect();
        let mut order: Few<usize> = located.iter().map(|&(shard, _)| shard).collect();
        order.sort_unstable();
        order.dedup();
        let mut guards: Few<(usize, MutexGuard<'_, Shard>)> =
            order.iter().map(|&i| (i, self.shards[i].lock())).collect();
        for (_, g) in guards.iter_mut() {
            if now >= g.swept_at.saturating_add(SWEEP_INTERVAL_US) {
                g.sweep(now);
            }
        }
        let guard = |guards: &[(usize, MutexGuard<'_, Shard>)], shard: usize| {
            guards
                .iter()
                .position(|(i, _)| *i == shard)
                .expect("every shard of the batch is locked")
        };

        let mut steps: Few<Step> = Few::with_capacity(batch.items.len());
        let mut expired = 0;
        for (i, (item, &(shard, key))) in batch.items.iter().zip(&located).enumerate() {
            let g = guard(&guards, shard);
            // A key repeated in the batch decides on the state its latest
            // admitted copy left, so every copy is charged in order (a
            // refused copy, or a check, charges nothing and leaves the
            // state as it was).
            let chained = (0..i)
                .rev()
                .find(|&j| located[j].1 == key && steps[j].state.is_some());
            let step = match chained {
                Some(j) => {
                    let state = steps[j].state.clone();
                    batch.step(item, state.as_ref(), now)
                }
                None => {
                    let state = guards[g].1.live(key, now);
                    let step = batch.step(item, state, now);
                    if item.algorithm.is_concurrency() && step.state.is_some() {
                        expired += concurrency::expired(state, now);
                    }
                    step
                }
            };
            steps.push(step);
        }
        let mut verdicts: super::Verdicts = steps.iter().map(|s| s.verdict).collect();
        let allowed = all_enforced_allow(batch.items, &verdicts);
        let mut evicted = 0;
        if allowed && !batch.peek {
            // Room is made for every new key of the request before any is
            // written, so a full shard never evicts what this request just
            // charged.
            let mut new_keys: Few<usize> = smallvec::smallvec![0; guards.len()];
            for (i, (&(shard, key), step)) in located.iter().zip(&steps).enumerate() {
                let g = guard(&guards, shard);
                let first = !located[..i].iter().any(|&(_, k)| k == key);
                if first && step.state.is_some() && !guards[g].1.map.contains_key(&key) {
                    new_keys[g] += 1;
                }
            }
            for (g, need) in new_keys.into_iter().enumerate() {
                if need > 0 {
                    evicted += guards[g].1.make_room(need, now);
                }
            }
            // In batch order: a repeated key ends with its last admitted
            // copy's state, which was decided on every earlier one's.
            for (&(shard, key), step) in located.iter().zip(steps) {
                if let Some(state) = step.state {
                    let g = guard(&guards, shard);
                    guards[g].1.put(key, state, now + step.ttl_us.max(1), now);
                }
            }
            // A request with more new keys in one shard than the shard may
            // hold still leaves it at its cap.
            for (_, g) in guards.iter_mut() {
                if g.map.len() > g.cap {
                    evicted += g.make_room(0, now);
                }
            }
        } else if !allowed {
            batch.uncharge(&mut verdicts);
        }
        drop(guards);
        self.report_evictions(evicted);
        if allowed && !batch.peek {
            self.report_expired(expired);
        }
        StoreDecision {
            allowed,
            verdicts,
            shard: self.shard_label.clone(),
            now,
            rtt: None,
        }
    }
}

impl MemoryStore {
    /// [`MemoryStore::decide_now`] for a request with one limit (the
    /// common case): one shard, one lock, nothing gathered.
    fn decide_one(&self, item: &super::Item, batch: &Batch<'_>, now: Micros) -> StoreDecision {
        let (shard, key) = self.locate(&item.key);
        let cost = batch.cost_of(item);
        let mut g = self.shards[shard].lock();
        if now >= g.swept_at.saturating_add(SWEEP_INTERVAL_US) {
            g.sweep(now);
        }
        let state = g.live(key, now);
        let expired = if item.algorithm.is_concurrency() {
            concurrency::expired(state, now)
        } else {
            0
        };
        let step = batch.step(item, state, now);
        let mut verdicts: super::Verdicts = smallvec::smallvec![step.verdict];
        let allowed = item.shadow || step.verdict.allowed;
        let mut evicted = 0;
        if allowed && !batch.peek {
            if let Some(state) = step.state {
                if !g.map.contains_key(&key) {
                    evicted += g.make_room(1, now);
                }
                g.put(key, state, now + step.ttl_us.max(1), now);
                drop(g);
                self.report_expired(expired);
            }
        } else if !allowed {
            uncharge(std::slice::from_ref(item), &mut verdicts, cost);
        }
        self.report_evictions(evicted);
        StoreDecision {
            allowed,
            verdicts,
            shard: self.shard_label.clone(),
            now,
            rtt: None,
        }
    }

    /// Settles `settle` here and now: every limit's shard locked in shard
    /// order, as a decision does, so the settle is atomic with decisions.
    pub fn settle_now(&self, settle: &super::Settle<'_>) {
        let now = settle.now.unwrap_or_else(|| self.clock.now_us());
        let located: Few<(usize, Key)> = settle.items.iter().map(|i| self.locate(&i.key)).collect();
        let mut order: Few<usize> = located.iter().map(|&(shard, _)| shard).collect();
        order.sort_unstable();
        order.dedup();
        let mut guards: Few<(usize, MutexGuard<'_, Shard>)> =
            order.iter().map(|&i| (i, self.shards[i].lock())).collect();
        let mut evicted = 0;
        for (item, &(shard, key)) in settle.items.iter().zip(&located) {
            let g = guards
                .iter()
                .position(|(i, _)| *i == shard)
                .expect("every shard of the settle is locked");
            let shard = &mut guards[g].1;
            let state = shard.live(key, now);
            let Some((state, ttl)) = crate::algorithm::settle(
                &item.algorithm,
                state,
                now,
                settle.charged_at,
                settle.adjust,
            ) else {
                continue;
            };
            if !shard.map.contains_key(&key) {
                evicted += shard.make_room(1, now);
            }
            shard.put(key, state, now + ttl.max(1), now);
        }
        drop(guards);
        self.report_evictions(evicted);
    }

    fn report_expired(&self, n: u64) {
        if n > 0
            && let Some(o) = self.observer.read().as_ref()
        {
            o.holders_expired(&self.shard_label, n);
        }
    }

    /// Applies `change` to the in-flight state of each of `items`, writing
    /// what it returns with a TTL of a hold timeout past the state's latest
    /// deadline (as a decision writes it). Returns
    /// how many items `change` left alone (no such holder).
    fn change_holders(
        &self,
        items: &[super::Item],
        change: impl Fn(Option<&State>, Micros, u64) -> Option<State>,
    ) -> u64 {
        let now = self.clock.now_us();
        let mut untouched = 0;
        for item in items {
            let crate::algorithm::Algorithm::Concurrency { hold_us, .. } = item.algorithm else {
                continue;
            };
            let (shard, key) = self.locate(&item.key);
            let mut g = self.shards[shard].lock();
            match change(g.live(key, now), now, hold_us) {
                Some(state) => {
                    let last = match &state {
                        State::Holders(h) => h.iter().map(|(_, d)| *d).max().unwrap_or(now),
                        _ => now,
                    };
                    g.put(key, state, last.max(now) + hold_us, now);
                }
                None => untouched += 1,
            }
        }
        untouched
    }

    fn report_evictions(&self, evicted: u64) {
        if evicted > 0 {
            self.evictions.fetch_add(evicted, Ordering::Relaxed);
            if let Some(o) = self.observer.read().as_ref() {
                o.evicted(&self.shard_label, evicted);
            }
        }
    }
}

/// Per-limit scratch of one decision: on the stack up to four limits.
type Few<T> = SmallVec<[T; 4]>;

#[async_trait::async_trait]
impl Store for MemoryStore {
    async fn decide(&self, batch: &Batch<'_>) -> Result<StoreDecision, StoreError> {
        Ok(self.decide_now(batch))
    }

    fn decide_sync(&self, batch: &Batch<'_>) -> Option<Result<StoreDecision, StoreError>> {
        Some(Ok(self.decide_now(batch)))
    }

    async fn release(&self, items: &[super::Item], holder: &str) -> Result<(), StoreError> {
        self.change_holders(items, |s, _, _| concurrency::release(s, holder));
        Ok(())
    }

    fn release_sync(&self, items: &[super::Item], holder: &str) -> Option<Result<(), StoreError>> {
        self.change_holders(items, |s, _, _| concurrency::release(s, holder));
        Some(Ok(()))
    }

    async fn renew(&self, items: &[super::Item], holder: &str) -> Result<u64, StoreError> {
        Ok(self.change_holders(items, |s, now, hold| {
            concurrency::renew(s, holder, now, hold)
        }))
    }

    fn shard_for(&self, _key: &str) -> Arc<str> {
        self.shard_label.clone()
    }

    fn kind(&self) -> &'static str {
        "memory"
    }

    async fn settle(&self, settle: &super::Settle<'_>) -> Result<(), StoreError> {
        self.settle_now(settle);
        Ok(())
    }

    async fn usage(&self) -> Vec<super::ShardUsage> {
        // Entries held, expired ones the sweeper has not dropped yet
        // included: what the process really keeps.
        vec![super::ShardUsage {
            shard: self.shard_label.clone(),
            keys: self.len() as u64,
            used_bytes: 0,
            max_bytes: 0,
        }]
    }

    fn observe(&self, observer: Arc<dyn StoreObserver>) {
        observer.evicted(&self.shard_label, 0);
        *self.observer.write() = Some(observer);
    }
}
