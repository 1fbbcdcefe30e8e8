//! The in-process store: sharded maps behind short locks, no global lock.
//!
//! A request's keys may live in several shards; their locks are taken in
//! shard order (so two requests cannot deadlock), every limit is decided,
//! and only if all admit are the new states written. Entries carry their
//! expiry; a shard drops expired entries whenever it has doubled in size
//! since its last sweep, so memory stays proportional to live keys under
//! millions of distinct ones, at amortised O(1) per insert.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::{Mutex, MutexGuard};

use super::{Batch, Store, StoreDecision, StoreError, all_enforced_allow, uncharge};
use crate::algorithm::State;
use crate::clock::{Clock, Micros, SystemClock};

const SHARDS: usize = 64;
const MIN_SWEEP_LEN: usize = 1024;

struct Entry {
    state: State,
    expires_at: Micros,
}

#[derive(Default)]
struct Shard {
    map: HashMap<String, Entry, ahash::RandomState>,
    sweep_at_len: usize,
}

impl Shard {
    fn live(&self, key: &str, now: Micros) -> Option<&State> {
        self.map
            .get(key)
            .filter(|e| e.expires_at > now)
            .map(|e| &e.state)
    }

    fn sweep(&mut self, now: Micros) {
        self.map.retain(|_, e| e.expires_at > now);
        self.sweep_at_len = (self.map.len() * 2).max(MIN_SWEEP_LEN);
    }

    fn insert(&mut self, key: &str, state: State, expires_at: Micros, now: Micros) {
        match self.map.get_mut(key) {
            Some(e) => {
                e.state = state;
                e.expires_at = expires_at;
            }
            None => {
                self.map.insert(key.to_owned(), Entry { state, expires_at });
                if self.map.len() > self.sweep_at_len {
                    self.sweep(now);
                }
            }
        }
    }
}

/// The in-process store. Cheap to clone; clones share counters.
#[derive(Clone)]
pub struct MemoryStore {
    shards: Arc<[Mutex<Shard>]>,
    hasher: ahash::RandomState,
    clock: Arc<dyn Clock>,
    shard_label: Arc<str>,
}

impl std::fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryStore")
            .field("keys", &self.len())
            .finish()
    }
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryStore {
    /// A store on the system clock.
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
        Self {
            shards: (0..SHARDS)
                .map(|_| Mutex::new(Shard::default()))
                .collect::<Vec<_>>()
                .into(),
            hasher: ahash::RandomState::new(),
            clock,
            shard_label: label.into(),
        }
    }

    /// Keys currently held, live or expired but not yet swept.
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().map.len()).sum()
    }

    /// Whether no key is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Drops every expired key now.
    pub fn sweep(&self) {
        let now = self.clock.now_us();
        for s in self.shards.iter() {
            s.lock().sweep(now);
        }
    }

    /// Drops every key (the local fallback forgets its state when Redis returns).
    pub fn clear(&self) {
        for s in self.shards.iter() {
            let mut s = s.lock();
            s.map.clear();
            s.sweep_at_len = MIN_SWEEP_LEN;
        }
    }

    fn shard_of(&self, key: &str) -> usize {
        (self.hasher.hash_one(key) as usize) % SHARDS
    }

    /// Decides a batch synchronously (the store never awaits).
    pub fn decide_now(&self, batch: &Batch<'_>) -> StoreDecision {
        let now = batch.now.unwrap_or_else(|| self.clock.now_us());
        let idx: Vec<usize> = batch.items.iter().map(|i| self.shard_of(&i.key)).collect();
        let mut order = idx.clone();
        order.sort_unstable();
        order.dedup();
        let mut guards: Vec<(usize, MutexGuard<'_, Shard>)> =
            order.iter().map(|&i| (i, self.shards[i].lock())).collect();
        let guard = |guards: &mut Vec<(usize, MutexGuard<'_, Shard>)>, shard: usize| {
            guards
                .iter()
                .position(|(i, _)| *i == shard)
                .expect("every shard of the batch is locked")
        };

        let cost = batch.effective_cost();
        let mut steps = Vec::with_capacity(batch.items.len());
        for (item, &shard) in batch.items.iter().zip(&idx) {
            let g = guard(&mut guards, shard);
            let state = guards[g].1.live(&item.key, now);
            steps.push(item.algorithm.decide(state, now, cost));
        }
        let mut verdicts: Vec<_> = steps.iter().map(|s| s.verdict).collect();
        let allowed = all_enforced_allow(batch.items, &verdicts);
        if allowed && !batch.peek {
            for ((item, &shard), step) in batch.items.iter().zip(&idx).zip(steps) {
                if let Some(state) = step.state {
                    let g = guard(&mut guards, shard);
                    guards[g]
                        .1
                        .insert(&item.key, state, now + step.ttl_us.max(1), now);
                }
            }
        } else if !allowed {
            uncharge(batch.items, &mut verdicts, cost);
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

#[async_trait::async_trait]
impl Store for MemoryStore {
    async fn decide(&self, batch: &Batch<'_>) -> Result<StoreDecision, StoreError> {
        Ok(self.decide_now(batch))
    }

    fn shard_for(&self, _key: &str) -> Arc<str> {
        self.shard_label.clone()
    }

    fn kind(&self) -> &'static str {
        "memory"
    }
}
