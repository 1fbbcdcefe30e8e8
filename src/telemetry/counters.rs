//! The `ratewatch_decisions_total` counters, kept per thread by series.
//!
//! Asking the recorder for a labelled counter builds a key, hashes it and
//! looks it up under a lock: on the memory store that was a fifth of a
//! whole decision. Each thread keeps the handles it has used instead, keyed
//! by the series' label strings (by address: the cache holds a clone of
//! each, so an address cannot be reused while cached).
//!
//! Only handles of ratewatch's own global recorder are kept: the recorder
//! in force is checked on every call, so a recorder set for a scope
//! (`metrics::with_local_recorder`) or installed by the application gets
//! the uncached path and sees every increment.

use std::cell::RefCell;
use std::sync::{Arc, OnceLock};

use ahash::AHashMap;
use metrics::{Counter, Label, Recorder, counter};

use super::Event;
use super::metrics::{DECISIONS_TOTAL, LABEL_OUTCOME, LABEL_ROUTE, LABEL_SHARD, LABEL_TIER};

/// Most series one thread keeps handles for; past it, the uncached path.
const MAX_CACHED: usize = 1024;

/// The address of ratewatch's own global recorder, once installed.
static OWN: OnceLock<usize> = OnceLock::new();

/// A series by the addresses of its tier, route, shard and limiter name
/// (0 for an unnamed limiter), and its outcome.
type Series = (usize, usize, usize, usize, u8);

/// The labels a cached handle keeps alive, and the handle.
type Cached = (Arc<str>, Arc<str>, Arc<str>, Option<Arc<str>>, Counter);

thread_local! {
    static DECISIONS: RefCell<AHashMap<Series, Cached>> = RefCell::new(AHashMap::new());
}

fn current_recorder() -> usize {
    metrics::with_recorder(|r| std::ptr::from_ref::<dyn Recorder>(r).cast::<()>() as usize)
}

/// Remembers the global recorder ratewatch just installed. A fresh thread
/// has no scoped recorder, so what it sees is the global one.
pub(crate) fn note_own_recorder() {
    let addr = std::thread::scope(|s| s.spawn(current_recorder).join().unwrap_or(0));
    if addr != 0 {
        let _ = OWN.set(addr);
    }
}

/// Whether the recorder in force is ratewatch's own global one (whose
/// handles a thread may keep).
pub(crate) fn own_recorder_in_force() -> bool {
    OWN.get().is_some_and(|&own| own == current_recorder())
}

/// Counts `e` in `ratewatch_decisions_total` through a cached handle,
/// under `limiter="<name>"` when the limiter is named. `false` when it did
/// not (another recorder is in force, or the cache is full): the caller
/// counts it the usual way.
pub(crate) fn count_decision(e: &Event, limiter: Option<&Arc<str>>) -> bool {
    if !own_recorder_in_force() {
        return false;
    }
    let series = (
        Arc::as_ptr(&e.tier).cast::<u8>() as usize,
        Arc::as_ptr(&e.route).cast::<u8>() as usize,
        Arc::as_ptr(&e.shard).cast::<u8>() as usize,
        limiter.map_or(0, |l| Arc::as_ptr(l).cast::<u8>() as usize),
        e.outcome as u8,
    );
    DECISIONS.with_borrow_mut(|cache| {
        if let Some((.., c)) = cache.get(&series) {
            c.increment(1);
            return true;
        }
        if cache.len() >= MAX_CACHED {
            return false;
        }
        let mut labels = vec![
            Label::new(LABEL_TIER, e.tier.clone()),
            Label::new(LABEL_ROUTE, e.route.clone()),
            Label::new(LABEL_SHARD, e.shard.clone()),
            Label::new(LABEL_OUTCOME, e.outcome.as_str()),
        ];
        super::metrics::push_limiter(&mut labels, limiter);
        let c = counter!(DECISIONS_TOTAL, labels);
        c.increment(1);
        cache.insert(
            series,
            (
                e.tier.clone(),
                e.route.clone(),
                e.shard.clone(),
                limiter.cloned(),
                c,
            ),
        );
        true
    })
}
