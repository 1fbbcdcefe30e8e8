//! The keys this instance tracks for leases, in bounded memory, and the
//! auto mode's hysteresis.
//!
//! A key gets an entry when it is in lease mode (configured `leased`, or
//! `auto` and hot by the sketch) or when a refusal of it is remembered.
//! At `max_keys` entries, new keys stay exact until a sweep evicts idle
//! ones: memory is bounded whatever clients send.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

use parking_lot::Mutex;

use super::entry::{Effects, Entry, Label, Step, Transition};
use super::sketch::{Ewma, RateSketch};
use super::{HotKey, sizing};
use crate::clock::Micros;
use crate::policy::{LeaseMode, LeaseSettings};
use crate::store::{Charge, Item, StoreDecision};
use crate::telemetry::lease as metrics;

const SHARDS: usize = 16;

/// An entry idle this long is dropped by a sweep (its lease, if any, given
/// back first).
const IDLE_US: Micros = 10_000_000;

/// Unspent units to give back to the store.
pub(crate) struct GiveBack {
    pub(crate) items: Arc<[Item]>,
    pub(crate) units: u64,
    pub(crate) charge: Charge,
}

/// One request as the lease table sees it.
pub(crate) struct Request<'a> {
    /// Hash of the request's keys.
    pub(crate) key: u64,
    pub(crate) items: &'a [Item],
    pub(crate) cost: u64,
    pub(crate) mode: LeaseMode,
}

/// Every tracked key of this instance.
pub(crate) struct Leases {
    shards: Box<[Mutex<HashMap<u64, Entry>>]>,
    sketch: RateSketch,
    /// Keys in lease mode now (the `ratewatch_lease_keys` gauge).
    leased: AtomicI64,
    /// Transitions into or out of lease mode so far.
    flips: AtomicI64,
}

impl Leases {
    pub(crate) fn new(origin: Micros) -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            sketch: RateSketch::new(origin),
            leased: AtomicI64::new(0),
            flips: AtomicI64::new(0),
        }
    }

    fn shard(&self, key: u64) -> &Mutex<HashMap<u64, Entry>> {
        &self.shards[(key >> 60) as usize % SHARDS]
    }

    /// The step for one request at `now`. `label` names the key for the
    /// dashboard if an entry is made.
    pub(crate) fn step(
        &self,
        req: &Request<'_>,
        now: Micros,
        s: &LeaseSettings,
        instances: u32,
        label: impl FnOnce() -> Label,
    ) -> (Step, Option<GiveBack>) {
        let mut shard = self.shard(req.key).lock();
        let fresh = !shard.contains_key(&req.key);
        let sketched = if fresh && req.mode == LeaseMode::Auto {
            // Only keys without an entry feed the sketch: a tracked key
            // keeps its own rate.
            self.sketch.add(req.key, now, req.cost as f64)
        } else {
            0.0
        };
        if fresh {
            let wanted = req.mode == LeaseMode::Leased || sketched >= s.enter_per_second;
            if !wanted || shard.len() >= per_shard(s) {
                return (Step::Exact, None);
            }
            let cap = sizing::max_lease(req.items, req.cost, s, instances);
            let mut e = Entry::new(req.items.into(), cap, label(), now);
            e.rate = Ewma::starting_at(sketched, now);
            shard.insert(req.key, e);
        }
        let e = shard.get_mut(&req.key).expect("inserted above");
        e.configured = req.mode == LeaseMode::Leased;
        // The largest lease follows a reload of `max_share`, the TTL or
        // `expected_instances`: an entry hot for hours must not keep the
        // cap of the policy it was made under (with more instances, the
        // old cap would break the false-refusal bound).
        e.cap = sizing::max_lease(req.items, req.cost, s, instances);
        let rate = e.rate.add(now, req.cost as f64);
        let (want, why) = match req.mode {
            LeaseMode::Leased => (true, Transition::Configured),
            LeaseMode::Auto if e.leased => (rate >= s.exit_per_second, Transition::Cooled),
            LeaseMode::Auto => (rate >= s.enter_per_second, Transition::Hot),
            LeaseMode::Exact => (false, Transition::Cooled),
        };
        let mut fx = Effects::default();
        let step = e.step(now, req.cost, want, why, s, &mut fx);
        let give = fx.give_back.take().map(|(units, charge)| GiveBack {
            items: e.items.clone(),
            units,
            charge,
        });
        drop(shard);
        self.effects(&fx);
        (step, give)
    }

    /// A take of `units` for `key`, sent at `t0`, was admitted.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn granted(
        &self,
        key: u64,
        t0: Micros,
        now: Micros,
        units: u64,
        used: u64,
        d: &StoreDecision,
        charge: Option<Charge>,
        s: &LeaseSettings,
        instances: u32,
    ) -> Option<GiveBack> {
        metrics::granted(units);
        if used > 0 {
            metrics::spent(used);
        }
        let mut fx = Effects::default();
        let mut shard = self.shard(key).lock();
        let mut give = None;
        match shard.get_mut(&key) {
            Some(e) => {
                fx.transition = e.install(t0, now, units, used, d, charge, s, instances, &mut fx);
                give = fx.give_back.take().map(|(units, charge)| GiveBack {
                    items: e.items.clone(),
                    units,
                    charge,
                });
            }
            None => {
                // Evicted meanwhile: the fresh units cannot be spent here.
                fx.expired += units - used;
            }
        }
        drop(shard);
        self.effects(&fx);
        give
    }

    /// A take for `key` sent at `t0` was refused.
    pub(crate) fn refused(&self, key: u64, t0: Micros, d: &StoreDecision, s: &LeaseSettings) {
        if let Some(e) = self.shard(key).lock().get_mut(&key) {
            metrics::transition(e.refused(t0, d, s));
        }
    }

    /// A take for `key` failed.
    pub(crate) fn failed(&self, key: u64) {
        if let Some(e) = self.shard(key).lock().get_mut(&key) {
            e.failed();
        }
    }

    /// Puts `units` spent from `key`'s lease with receipt `from` back into
    /// it (the rest of the request was refused or could not be decided);
    /// what cannot go back into that very lease is returned to give back
    /// to the store with its own receipt.
    pub(crate) fn put_back(
        &self,
        key: u64,
        units: u64,
        from: Charge,
        now: Micros,
    ) -> Option<GiveBack> {
        let mut shard = self.shard(key).lock();
        let Some(e) = shard.get_mut(&key) else {
            // Evicted meanwhile: the units stay charged (the safe side).
            metrics::expired(units);
            return None;
        };
        if e.put_back(units, &from, now) {
            return None;
        }
        Some(GiveBack {
            items: e.items.clone(),
            units,
            charge: from,
        })
    }

    /// A per-request decision of a leased or auto key, sent at `t0`, was
    /// answered `d` at `now`: a refusal is remembered, making an entry if
    /// there is room.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn heard(
        &self,
        req: &Request<'_>,
        t0: Micros,
        now: Micros,
        d: &StoreDecision,
        s: &LeaseSettings,
        instances: u32,
        label: impl FnOnce() -> Label,
    ) {
        let mut shard = self.shard(req.key).lock();
        if !shard.contains_key(&req.key) {
            if d.allowed || shard.len() >= per_shard(s) {
                return;
            }
            let cap = sizing::max_lease(req.items, req.cost, s, instances);
            shard.insert(req.key, Entry::new(req.items.into(), cap, label(), now));
        }
        if let Some(e) = shard.get_mut(&req.key) {
            e.heard(t0, now, d);
        }
    }

    /// Expires leases past their time, takes `auto` keys that went quiet
    /// and any key gone idle out of lease mode, and drops idle entries;
    /// returns the leases to give back.
    pub(crate) fn sweep(&self, now: Micros, s: &LeaseSettings) -> Vec<GiveBack> {
        let mut give = Vec::new();
        let mut fx = Effects::default();
        for shard in self.shards.iter() {
            let mut shard = shard.lock();
            shard.retain(|_, e| {
                e.expire(now, &mut fx);
                if let Some((units, charge)) = fx.give_back.take() {
                    give.push(GiveBack {
                        items: e.items.clone(),
                        units,
                        charge,
                    });
                }
                // A configured key leaves only when idle: cooling it by
                // rate would flip it out and back in on every request.
                let quiet = !e.configured && e.rate.rate(now) < s.exit_per_second;
                let idle = now.saturating_sub(e.last_seen) >= IDLE_US;
                if e.leased && (quiet || idle) && !e.renewing {
                    e.leased = false;
                    metrics::transition(Transition::Cooled);
                    self.leased.fetch_sub(1, Ordering::Relaxed);
                    self.flips.fetch_add(1, Ordering::Relaxed);
                    if let Some((units, charge)) = e.release() {
                        give.push(GiveBack {
                            items: e.items.clone(),
                            units,
                            charge,
                        });
                    }
                }
                !(idle && !e.renewing && e.held.is_none())
            });
        }
        self.effects(&fx);
        metrics::leased_keys(self.leased.load(Ordering::Relaxed));
        give
    }

    /// Whether a take is in flight for any key.
    pub(crate) fn renewing(&self) -> bool {
        self.shards
            .iter()
            .any(|s| s.lock().values().any(|e| e.renewing))
    }

    /// Every lease held, taken out to give back (at shutdown).
    pub(crate) fn drain(&self) -> Vec<GiveBack> {
        let mut give = Vec::new();
        for shard in self.shards.iter() {
            for e in shard.lock().values_mut() {
                if let Some((units, charge)) = e.release() {
                    give.push(GiveBack {
                        items: e.items.clone(),
                        units,
                        charge,
                    });
                }
            }
        }
        give
    }

    /// Keys in lease mode here, hottest first.
    pub(crate) fn hot_keys(&self, now: Micros) -> Vec<HotKey> {
        let mut keys: Vec<HotKey> = self
            .shards
            .iter()
            .flat_map(|shard| {
                shard
                    .lock()
                    .values()
                    .filter(|e| e.leased)
                    .map(|e| HotKey {
                        identity: e.label.identity.clone(),
                        tier: e.label.tier.to_string(),
                        route: e.label.route.to_string(),
                        units: e.units(),
                        rate: e.rate.rate(now),
                    })
                    .collect::<Vec<_>>()
            })
            .collect();
        keys.sort_by(|a, b| b.rate.total_cmp(&a.rate));
        keys
    }

    fn effects(&self, fx: &Effects) {
        if fx.spent > 0 {
            metrics::spent(fx.spent);
        }
        if fx.expired > 0 {
            metrics::expired(fx.expired);
        }
        if let Some(t) = fx.transition {
            metrics::transition(t);
            if t != Transition::Tail {
                self.flips.fetch_add(1, Ordering::Relaxed);
            }
            match t {
                Transition::Hot | Transition::Configured => {
                    self.leased.fetch_add(1, Ordering::Relaxed);
                }
                Transition::Cooled => {
                    self.leased.fetch_sub(1, Ordering::Relaxed);
                }
                Transition::Tail => {}
            }
            metrics::leased_keys(self.leased.load(Ordering::Relaxed));
        }
    }
}

fn per_shard(s: &LeaseSettings) -> usize {
    s.max_keys.div_ceil(SHARDS).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::{Algorithm, Verdict};

    const QUOTA: u64 = 1_000_000;

    fn items() -> Vec<Item> {
        vec![Item::new(
            "rw:{rt:x}:all:tb",
            Algorithm::TokenBucket {
                capacity: QUOTA,
                refill_per_second: QUOTA as f64,
            },
        )]
    }

    fn label() -> Label {
        Label {
            identity: "free_tk…9f3a".into(),
            tier: "free".into(),
            route: "/search".into(),
        }
    }

    fn admitted(now: Micros) -> StoreDecision {
        StoreDecision {
            allowed: true,
            verdicts: smallvec::smallvec![Verdict {
                allowed: true,
                remaining: (QUOTA / 2) as f64,
                reset_after_us: 1_000,
                retry_after_us: 0,
                delay_us: 0,
            }],
            shard: "127.0.0.1:6379".into(),
            now,
            rtt: None,
        }
    }

    /// Runs `rate` requests per second for `secs` seconds from `*t` on an
    /// auto key, answering takes at once; returns how many requests were
    /// answered locally.
    fn run(l: &Leases, t: &mut Micros, rate: u64, secs: u64) -> usize {
        let s = LeaseSettings::default();
        let items = items();
        let req = Request {
            key: 99,
            items: &items,
            cost: 1,
            mode: LeaseMode::Auto,
        };
        let mut local = 0;
        for _ in 0..rate * secs {
            *t += 1_000_000 / rate;
            match l.step(&req, *t, &s, 1, label).0 {
                Step::Take { units } => {
                    l.granted(99, *t, *t, units, 1, &admitted(*t), None, &s, 1);
                }
                Step::Local { renew, .. } => {
                    local += 1;
                    if let Some(units) = renew {
                        l.granted(99, *t, *t, units, 0, &admitted(*t), None, &s, 1);
                    }
                }
                Step::Exact => {}
            }
        }
        local
    }

    fn leased(l: &Leases) -> bool {
        !l.hot_keys(0).is_empty()
    }

    #[test]
    fn a_key_below_the_entry_rate_stays_exact() {
        let l = Leases::new(0);
        let mut t = 0;
        assert_eq!(run(&l, &mut t, 35, 5), 0);
        assert!(!leased(&l));
    }

    #[test]
    fn a_hot_key_enters_lease_mode_once_and_stays_under_steady_load() {
        let l = Leases::new(0);
        let mut t = 0;
        let local = run(&l, &mut t, 200, 5);
        assert!(local > 800, "only {local} of 1000 answered locally");
        assert_eq!(l.leased.load(Ordering::Relaxed), 1);
        // Once in, never out and in again: no flapping.
        assert_eq!(l.flips.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn between_the_thresholds_a_leased_key_stays_leased_and_a_quiet_one_leaves() {
        let l = Leases::new(0);
        let mut t = 0;
        run(&l, &mut t, 200, 3);
        assert!(leased(&l));
        // Between exit (20/s) and entry (50/s): hysteresis keeps it.
        let local = run(&l, &mut t, 35, 5);
        assert!(leased(&l));
        assert_eq!(l.flips.load(Ordering::Relaxed), 1);
        assert!(local > 150, "{local}");
        // Below exit: it leaves lease mode on its own next request.
        run(&l, &mut t, 5, 3);
        assert!(!leased(&l));
        assert_eq!(l.leased.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn a_reload_with_more_instances_shrinks_the_leases_of_a_hot_key() {
        let s = LeaseSettings::default();
        let items = vec![Item::new(
            "rw:{free:x}:hour:fw",
            Algorithm::FixedWindow {
                limit: 1_000,
                window_us: 3_600_000_000,
            },
        )];
        let req = Request {
            key: 7,
            items: &items,
            cost: 1,
            mode: LeaseMode::Leased,
        };
        let grant = |t: Micros| StoreDecision {
            allowed: true,
            verdicts: smallvec::smallvec![Verdict {
                allowed: true,
                remaining: 500.0,
                reset_after_us: 1_000_000,
                retry_after_us: 0,
                delay_us: 0,
            }],
            shard: "s".into(),
            now: t,
            rtt: None,
        };
        let l = Leases::new(0);
        let mut t = 0;
        let mut largest_after = 0;
        // 10,000 requests per second: one instance, then ten.
        for i in 0..4_000 {
            t += 100;
            let instances = if i < 2_000 { 1 } else { 10 };
            let units = match l.step(&req, t, &s, instances, label).0 {
                Step::Take { units } => Some(units),
                Step::Local { renew, .. } => renew,
                Step::Exact => None,
            };
            if let Some(units) = units {
                l.granted(7, t, t, units, 0, &grant(t), None, &s, instances);
                if instances == 10 {
                    largest_after = largest_after.max(units);
                }
            }
        }
        // floor(0.25 x 1000 / 10).
        assert!(largest_after > 0, "no take after the reload");
        assert!(
            largest_after <= 25,
            "a take of {largest_after} units with a cap of 25"
        );
    }

    #[test]
    fn a_configured_key_at_a_low_rate_is_not_cooled_by_every_sweep() {
        let s = LeaseSettings::default();
        let l = Leases::new(0);
        let items = items();
        let req = Request {
            key: 5,
            items: &items,
            cost: 1,
            mode: LeaseMode::Leased,
        };
        let mut t = 0;
        // 5 requests per second for 5 seconds, below exit_per_second,
        // with the sweep running every renew interval as it does.
        for _ in 0..25 {
            for _ in 0..2 {
                t += 100_000;
                l.sweep(t, &s);
            }
            match l.step(&req, t, &s, 1, label).0 {
                Step::Take { units } => {
                    l.granted(5, t, t, units, 1, &admitted(t), None, &s, 1);
                }
                Step::Local {
                    renew: Some(units), ..
                } => {
                    l.granted(5, t, t, units, 0, &admitted(t), None, &s, 1);
                }
                _ => {}
            }
        }
        assert!(leased(&l));
        assert_eq!(
            l.flips.load(Ordering::Relaxed),
            1,
            "a configured key flapped"
        );
    }

    #[test]
    fn a_client_rotating_keys_never_grows_the_table_past_max_keys() {
        let s = LeaseSettings {
            max_keys: 32,
            ..LeaseSettings::default()
        };
        let l = Leases::new(0);
        let items = items();
        let mut refused = admitted(0);
        refused.allowed = false;
        refused.verdicts[0].allowed = false;
        refused.verdicts[0].retry_after_us = 1_000_000;
        for key in 0..10_000u64 {
            let req = Request {
                key: key.wrapping_mul(0x9E37_79B9_7F4A_7C15),
                items: &items,
                cost: 1,
                mode: LeaseMode::Leased,
            };
            l.step(&req, key, &s, 1, label);
            l.heard(&req, key, key, &refused, &s, 1, label);
        }
        let held: usize = l.shards.iter().map(|s| s.lock().len()).sum();
        assert!(held <= 32, "{held} entries for max_keys = 32");
    }

    #[test]
    fn a_sweep_takes_a_key_that_stopped_out_of_lease_mode_and_forgets_it() {
        let l = Leases::new(0);
        let mut t = 0;
        run(&l, &mut t, 200, 2);
        assert!(leased(&l));
        l.sweep(t + 3_000_000, &LeaseSettings::default());
        assert!(!leased(&l));
        l.sweep(t + 20_000_000, &LeaseSettings::default());
        assert!(l.shards.iter().all(|s| s.lock().is_empty()));
    }
}
