//! One breaker per shard, shared by every request of a limiter, each behind
//! its own short lock. Breakers appear as shards are first seen.
//!
//! Built [`ShardBreakers::with_probes`] on a store that probes, the
//! breakers are health-checked: when one opens, a background task (see
//! `probe.rs`) runs the store's probe once per cooldown until it succeeds,
//! and requests never probe.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Mutex, RwLock};

use super::log_gate::LogGate;
use super::permit::PermitGuard;
use super::{Breaker, BreakerState, Permit, Refused, Trip};
use crate::clock::{Clock, Micros, SystemClock};
use crate::policy::BreakerSettings;
use crate::store::{ErrorClass, Store, StoreError};

/// Hears what the breakers do, so that telemetry can show it while
/// resilience knows nothing of telemetry (the limiter plugs one in).
/// Calls come from the request path and must be cheap.
pub trait BreakerObserver: Send + Sync + 'static {
    /// `shard`'s breaker is now in `state` (also called once, closed, when
    /// a shard is first seen).
    fn state(&self, shard: &str, state: BreakerState);

    /// A health probe of `shard` failed: the shard is still down and its
    /// breaker stays open. This is not a new trip (a trip is closed ->
    /// open, which the caller that reported it counts); nothing by default.
    fn probe_tripped(&self, shard: &str) {
        let _ = shard;
    }
}

/// What a report changed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Change {
    /// Nothing the caller must act on.
    None,
    /// The breaker opened.
    Tripped(Trip),
    /// The probe succeeded and the breaker closed: decisions go back to the
    /// store (local fallback counts are kept and expire on their windows).
    Closed,
}

/// The breakers of every shard. Cheap to clone; clones share the breakers.
#[derive(Clone)]
pub struct ShardBreakers {
    pub(super) shared: Arc<Shared>,
}

pub(super) struct Shared {
    settings: BreakerSettings,
    pub(super) clock: Arc<dyn Clock>,
    breakers: RwLock<HashMap<Arc<str>, Arc<Mutex<Breaker>>>>,
    /// The store whose probe closes the breakers, and the budget of one probe.
    pub(super) prober: Option<(Arc<dyn Store>, Duration)>,
    /// Shards whose probe task is running.
    pub(super) probing: Mutex<HashSet<Arc<str>>>,
    /// Who hears of state changes, once set.
    observer: std::sync::OnceLock<Arc<dyn BreakerObserver>>,
    /// Keeps "still down" lines to one per shard per interval.
    still_down: LogGate,
    /// Per shard, the most telling store error since its last success.
    errors: Mutex<HashMap<Arc<str>, (ErrorClass, String)>>,
}

/// At most one "still down" line per shard this often while its breaker
/// stays open (the line that it opened always goes).
pub const STILL_DOWN_LOG_EVERY: Duration = Duration::from_secs(10);

impl std::fmt::Debug for ShardBreakers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShardBreakers")
            .field("settings", &self.shared.settings)
            .field("health_checked", &self.shared.prober.is_some())
            .field("states", &self.states())
            .finish()
    }
}

/// The budget of one health probe: a fresh connection, perhaps a script
/// load, and one decision, so a few decision budgets, never so short that a
/// loaded machine fails a healthy Redis.
fn probe_budget(decision_timeout: Duration) -> Duration {
    (decision_timeout * 4).max(Duration::from_millis(250))
}

impl ShardBreakers {
    /// Breakers with `settings`, on the system clock, probed by requests.
    pub fn new(settings: BreakerSettings) -> Self {
        Self::build(settings, Arc::new(SystemClock), None)
    }

    /// Breakers with `settings` on `clock`. If `store` probes
    /// ([`Store::probes`]), an open breaker is closed by the store's probe,
    /// run in the background once per cooldown; otherwise requests probe.
    /// `decision_timeout` (the store's budget for one decision) sizes the
    /// probe's budget.
    pub fn with_probes(
        settings: BreakerSettings,
        clock: Arc<dyn Clock>,
        store: Arc<dyn Store>,
        decision_timeout: Duration,
    ) -> Self {
        // A probe never outlives the cooldown, or a request would take it
        // for lost and probe in its place.
        let budget = probe_budget(decision_timeout).min(settings.open.max(decision_timeout));
        let prober = store.probes().then_some((store, budget));
        Self::build(settings, clock, prober)
    }

    fn build(
        settings: BreakerSettings,
        clock: Arc<dyn Clock>,
        prober: Option<(Arc<dyn Store>, Duration)>,
    ) -> Self {
        Self {
            shared: Arc::new(Shared {
                settings,
                clock,
                breakers: RwLock::new(HashMap::new()),
                prober,
                probing: Mutex::new(HashSet::new()),
                observer: std::sync::OnceLock::new(),
                still_down: LogGate::new(STILL_DOWN_LOG_EVERY.as_micros() as u64),
                errors: Mutex::new(HashMap::new()),
            }),
        }
    }

    /// Reports every state change (and every shard first seen) to
    /// `observer` from now on. Set once; later calls are ignored.
    pub fn observe(&self, observer: Arc<dyn BreakerObserver>) {
        let _ = self.shared.observer.set(observer);
    }

    fn note(&self, shard: &str, state: BreakerState) {
        if let Some(o) = self.shared.observer.get() {
            o.state(shard, state);
        }
    }

    /// Tells the observer that a health probe failed and reopened `shard`.
    pub(super) fn note_probe_trip(&self, shard: &str) {
        if let Some(o) = self.shared.observer.get() {
            o.probe_tripped(shard);
        }
    }

    /// Remembers that a call to `shard` failed with `error`, before its
    /// outcome is reported: the breaker's log lines name it. A telling
    /// error ([`ErrorClass::is_telling`]) is not replaced by a vague one
    /// (a broken pipe after Redis refused an unauthenticated command), so
    /// the line says where to look; otherwise the latest error wins.
    pub fn note_error(&self, shard: &Arc<str>, error: &StoreError) {
        let class = error.class();
        let mut errors = self.shared.errors.lock();
        match errors.get(shard) {
            Some((kept, _)) if kept.is_telling() && !class.is_telling() => {}
            _ => {
                errors.insert(shard.clone(), (class, error.summary()));
            }
        }
    }

    /// The error [`ShardBreakers::note_error`] kept for `shard` since its
    /// last success, as `<class>: <message>`; `error` if none was noted.
    pub fn last_error(&self, shard: &Arc<str>) -> String {
        self.shared
            .errors
            .lock()
            .get(shard)
            .map_or_else(|| "error".to_owned(), |(_, summary)| summary.clone())
    }

    /// `shard` is still down: a probe (a health check, or a request where
    /// requests probe) failed and the breaker opened again. Logged at WARN
    /// with [`ShardBreakers::last_error`] at most once per
    /// [`STILL_DOWN_LOG_EVERY`] per shard, with the number of failed probes
    /// the line stands for. Never counted as a trip.
    pub fn still_down(&self, shard: &Arc<str>) {
        if let Some(held_back) = self.shared.still_down.admit(shard, self.now()) {
            let last_error = self.last_error(shard);
            tracing::warn!(
                %shard,
                last_error = last_error.as_str(),
                failed_probes = held_back + 1,
                "store shard still down; circuit breaker stays open"
            );
        }
    }

    /// Now, on the breakers' clock.
    pub fn now(&self) -> Micros {
        self.shared.clock.now_us()
    }

    fn breaker(&self, shard: &Arc<str>) -> Arc<Mutex<Breaker>> {
        if let Some(b) = self.shared.breakers.read().get(shard) {
            return b.clone();
        }
        let mut map = self.shared.breakers.write();
        map.entry(shard.clone())
            .or_insert_with(|| {
                self.note(shard, BreakerState::Closed);
                let breaker = Breaker::new(self.shared.settings);
                let breaker = if self.shared.prober.is_some() {
                    breaker.health_checked()
                } else {
                    breaker
                };
                Arc::new(Mutex::new(breaker))
            })
            .clone()
    }

    /// Leave to call `shard` now, as a guard that gives the permit back if
    /// it is dropped unreported (the request's future was dropped, timed
    /// out or panicked), so a probe is never lost.
    pub fn enter(&self, shard: &Arc<str>) -> Result<PermitGuard, Refused> {
        let permit = self.acquire(shard, self.now())?;
        Ok(PermitGuard::new(self.clone(), shard.clone(), permit))
    }

    /// Leave to call `shard` at `now`, or why not.
    pub fn acquire(&self, shard: &Arc<str>, now: Micros) -> Result<Permit, Refused> {
        let breaker = self.breaker(shard);
        let mut b = breaker.lock();
        let before = b.state();
        let permit = b.acquire(now);
        let after = b.state();
        if before != after {
            self.note(shard, after);
        }
        permit
    }

    /// Leave to run `shard`'s health check now, if it is due.
    pub(super) fn acquire_probe(&self, shard: &Arc<str>) -> Option<PermitGuard> {
        let breaker = self.breaker(shard);
        let mut b = breaker.lock();
        let permit = b.acquire_probe(self.now())?;
        self.note(shard, b.state());
        drop(b);
        Some(PermitGuard::new(self.clone(), shard.clone(), permit))
    }

    /// When `shard`'s next probe is due (`None`: closed).
    pub(super) fn next_probe_at(&self, shard: &Arc<str>) -> Option<Micros> {
        self.breaker(shard).lock().next_probe_at()
    }

    /// Gives back a permit whose call was not made.
    pub fn release(&self, shard: &Arc<str>, permit: Permit, now: Micros) {
        let breaker = self.breaker(shard);
        let mut b = breaker.lock();
        let before = b.state();
        b.release(permit, now);
        if b.state() != before {
            self.note(shard, b.state());
        }
    }

    /// Reports the outcome of a permitted call.
    pub fn report(&self, shard: &Arc<str>, permit: Permit, ok: bool, now: Micros) -> Change {
        let breaker = self.breaker(shard);
        let mut b = breaker.lock();
        if ok {
            self.shared.errors.lock().remove(shard);
        }
        let change = if ok {
            match b.on_success(permit, now) {
                Some(t) if t.to == BreakerState::Closed => {
                    self.note(shard, t.to);
                    self.shared.still_down.forget(shard);
                    Change::Closed
                }
                Some(t) => {
                    self.note(shard, t.to);
                    Change::None
                }
                None => Change::None,
            }
        } else {
            match b.on_failure(permit, now) {
                Some(trip) => {
                    self.note(shard, BreakerState::Open);
                    if trip.from == BreakerState::Closed {
                        // The caller logs the trip: the next "still down"
                        // line waits a whole interval from it.
                        self.shared.still_down.wrote(shard, now);
                    }
                    Change::Tripped(trip)
                }
                None => Change::None,
            }
        };
        drop(b);
        if let Change::Tripped(_) = change {
            super::probe::start(self, shard);
        }
        change
    }

    /// Every known shard and its breaker's state, sorted by shard.
    pub fn states(&self) -> Vec<(Arc<str>, BreakerState)> {
        let mut out: Vec<_> = self
            .shared
            .breakers
            .read()
            .iter()
            .map(|(s, b)| (s.clone(), b.lock().state()))
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }
}
