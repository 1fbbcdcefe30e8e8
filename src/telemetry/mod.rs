//! Telemetry: decision events, Prometheus metrics and the fleet view.
//!
//! The hot path only calls [`Telemetry::record`], which takes one short
//! lock, never awaits and never fails a request. Each event updates the
//! Prometheus metrics of [`metrics`] and the current interval's aggregate;
//! every `flush_interval` a task flushes the aggregate into the fleet view
//! (in process, or one Redis pipeline per time bucket), which
//! [`FleetReader::query`] merges over a time range for the dashboard.
//!
//! The in-process view is kept whatever the store: with Redis it is this
//! instance's own share (the last six hours), which the dashboard shows
//! (marked as such) when the fleet view in Redis does not answer within
//! [`READ_BUDGET`].
//!
//! ```
//! use std::sync::Arc;
//! use ratewatch::policy::TelemetrySettings;
//! use ratewatch::telemetry::{Event, Outcome, Telemetry};
//! # tokio::runtime::Runtime::new().unwrap().block_on(async {
//! let telemetry = Telemetry::in_process(&TelemetrySettings::default());
//! telemetry.record(&Event {
//!     tier: Arc::from("free"),
//!     route: Arc::from("*"),
//!     limit: Some(Arc::from("burst")),
//!     exceeded: vec![Arc::from("burst")],
//!     outcome: Outcome::Blocked,
//!     shard: Arc::from("memory"),
//!     identity: "free_tk…9f3a".into(),
//!     cost: 1,
//!     units: Default::default(),
//!     redis_rtt: None,
//!     fallback: None,
//! });
//! let now = ratewatch::telemetry::unix_now();
//! let stats = telemetry.fleet().query(now - 60, now).await.unwrap();
//! assert_eq!(stats.totals["free"]["blocked"], 1);
//! assert_eq!(stats.top_blocked[0].identity, "free_tk…9f3a");
//! # });
//! ```

mod aggregate;
pub mod cost;
mod counters;
#[cfg(feature = "rls")]
pub(crate) mod detailed;
mod event;
mod fleet;
pub mod inflight;
mod labelled;
pub mod lease;
mod memory_view;
pub mod metrics;
#[cfg(feature = "redis-store")]
mod pending;
#[cfg(feature = "redis-store")]
mod redis_sink;
pub mod rls;
mod series;
mod sharded;
pub mod span;
mod topk;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::{SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;

#[cfg(feature = "redis-store")]
use crate::policy::StoreKind;
use crate::policy::{StoreSettings, TelemetrySettings};
use aggregate::Flat;
use memory_view::MemoryView;

pub use aggregate::FAIL_CLOSED;
pub use aggregate::MAX_SERIES;
pub(crate) use aggregate::append_display_name;
pub use event::{Event, FallbackReason, Outcome, UnitsCharged};
pub use fleet::{
    BlockedKey, FleetStats, HotKey, HotShard, InstanceSeen, MAX_INSTANCES_LISTED, Outage,
    PeriodRates, PolicySeen, RESOLUTIONS, Resolution, RttSeries, RttStats, Unavailable, UnitKey,
    ViewSource, quantile,
};
pub use metrics::{DropReason, RttOp, render};
#[cfg(feature = "redis-store")]
pub use redis_sink::{Endpoints, RedisTarget};
pub use topk::TopK;

/// Why the fleet view could not be read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TelemetryError {
    /// Redis answered an error or could not be reached.
    #[cfg(feature = "redis-store")]
    #[error("fleet view in Redis: {0}")]
    Redis(#[from] redis::RedisError),
    /// Redis did not answer within the budget.
    #[error("fleet view in Redis did not answer in time")]
    Timeout,
    /// `from` is after `to`.
    #[error("time range starts at {from}, after its end {to}")]
    InvalidRange {
        /// Range start.
        from: u64,
        /// Range end.
        to: u64,
    },
}

impl TelemetryError {
    /// Whether trying again later may succeed.
    pub fn is_transient(&self) -> bool {
        !matches!(self, TelemetryError::InvalidRange { .. })
    }

    /// Whether the error is a timeout.
    pub fn is_timeout(&self) -> bool {
        match self {
            TelemetryError::Timeout => true,
            #[cfg(feature = "redis-store")]
            TelemetryError::Redis(e) => e.is_timeout(),
            TelemetryError::InvalidRange { .. } => false,
        }
    }
}

/// Seconds since the Unix epoch, the time of fleet-view buckets.
pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// How long the dashboard waits for the fleet view in Redis before it
/// answers from this instance's in-process view instead.
pub const READ_BUDGET: std::time::Duration = std::time::Duration::from_millis(300);

enum Sink {
    /// The in-process view is the fleet (memory store).
    Memory,
    #[cfg(feature = "redis-store")]
    Redis(Box<redis_sink::RedisSink>),
}

struct Inner {
    batch: sharded::ShardedBatch,
    sink: Sink,
    /// This instance's view, kept whatever the sink.
    local: MemoryView,
    /// Since when, and why, the fleet view in Redis has not answered.
    // Only a Redis fleet view can be unavailable.
    #[cfg_attr(not(feature = "redis-store"), allow(dead_code))]
    unavailable: Mutex<Option<Unavailable>>,
    settings: TelemetrySettings,
    /// Serialises flushes: the periodic task and `shutdown` never
    /// interleave.
    flushing: tokio::sync::Mutex<()>,
    closed: AtomicBool,
    /// `version#hash` of the policy in force, carried by every flush so the
    /// fleet view shows which instances run which policy.
    policy: Mutex<Option<Arc<str>>>,
    /// This instance's name in the fleet view ([`instance_name`]).
    instance: Arc<str>,
    /// Since when, and why, flushes to Redis have failed: unlike
    /// `unavailable`, a read that answers does not end it, only a flush
    /// that writes what was kept.
    #[cfg_attr(not(feature = "redis-store"), allow(dead_code))]
    outage: Mutex<Option<Unavailable>>,
    /// The latest outage that ended, for the page.
    #[cfg_attr(not(feature = "redis-store"), allow(dead_code))]
    last_outage: Mutex<Option<Outage>>,
}

/// Longest instance name kept, in characters.
pub const MAX_INSTANCE_NAME: usize = 64;

/// This instance's name in the fleet view: `RATEWATCH_INSTANCE` if set,
/// else `host:pid` (the kernel's host name), without control characters
/// and at most [`MAX_INSTANCE_NAME`] characters. Not a metric label: it
/// only appears in the fleet view's per-bucket `inst` and `seen` hashes.
pub fn instance_name() -> String {
    let named = std::env::var("RATEWATCH_INSTANCE")
        .ok()
        .filter(|n| !n.trim().is_empty());
    let name = named.unwrap_or_else(|| {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .ok()
            .or_else(|| std::env::var("HOSTNAME").ok())
            .map(|h| h.trim().to_owned())
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| "instance".to_owned());
        format!("{host}:{}", std::process::id())
    });
    name.chars()
        .filter(|c| !c.is_control())
        .take(MAX_INSTANCE_NAME)
        .collect()
}

/// What one pipeline holds until its next flush.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Backlog {
    /// Events aggregated.
    pub events: u64,
    /// Distinct (tier, route, shard, outcome) series (at most [`MAX_SERIES`]).
    pub series: usize,
    /// Blocked identities tracked (at most `top_keys`).
    pub identities: usize,
}

/// The telemetry pipeline of a limiter. Cheap to clone; clones share it.
#[derive(Clone, Default)]
pub struct Telemetry {
    inner: Option<Arc<Inner>>,
    /// The limiter's name (`[telemetry] limiter_name`): every metric this
    /// handle records carries it as a `limiter` label. `None` adds nothing.
    limiter: Option<Arc<str>>,
}

impl std::fmt::Debug for Telemetry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match self.inner.as_deref().map(|i| &i.sink) {
            None => "metrics-only",
            Some(Sink::Memory) => "in-process",
            #[cfg(feature = "redis-store")]
            Some(Sink::Redis(_)) => "redis",
        };
        f.debug_struct("Telemetry")
            .field("fleet_view", &kind)
            .field("limiter", &self.limiter)
            .finish()
    }
}

impl Telemetry {
    /// A pipeline that records Prometheus metrics only: no fleet view.
    pub fn new() -> Self {
        Self::disabled()
    }

    /// Prometheus metrics only, no fleet view (the cheapest; for benchmarks
    /// and for limiters that do not want a dashboard).
    pub fn disabled() -> Self {
        Self {
            inner: None,
            limiter: None,
        }
    }

    /// The fleet view kept in process (the memory store: one instance is
    /// the fleet). Flushes every `flush_interval` on the current tokio
    /// runtime, if any; reads always include what was not flushed yet.
    pub fn in_process(settings: &TelemetrySettings) -> Self {
        Self::start(settings, Sink::Memory)
    }

    /// The fleet view in Redis, shared by every instance writing to the
    /// same keys. Never fails, even if Redis is down: it connects on the
    /// first flush, and while Redis is away flushed batches are kept (at
    /// most an hour of 10 s buckets; older ones are dropped and counted in
    /// `ratewatch_telemetry_dropped_total{reason="buffer_full"}`) and
    /// written into their original buckets once it answers again. Call it within a tokio
    /// runtime so the flush task can start.
    #[cfg(feature = "redis-store")]
    pub fn redis(settings: &TelemetrySettings, target: RedisTarget) -> Self {
        Self::start(
            settings,
            Sink::Redis(Box::new(redis_sink::RedisSink::new(
                target,
                settings.top_keys,
            ))),
        )
    }

    /// The fleet view a store's settings call for: in Redis for the Redis
    /// kinds (keys under `key_prefix`, flushes bounded by the store timeout
    /// times 20), in process for the memory store.
    pub fn for_store(settings: &TelemetrySettings, store: &StoreSettings) -> Self {
        #[cfg(feature = "redis-store")]
        {
            let timeout = (store.timeout * 20).min(std::time::Duration::from_secs(2));
            let target = match store.kind {
                StoreKind::Redis => Some(RedisTarget::node(
                    store
                        .url
                        .clone()
                        .unwrap_or_else(|| crate::policy::DEFAULT_REDIS_URL.to_owned()),
                    store.key_prefix.clone(),
                )),
                StoreKind::RedisCluster if !store.nodes.is_empty() => Some(RedisTarget::cluster(
                    store.nodes.clone(),
                    store.key_prefix.clone(),
                )),
                _ => None,
            };
            if let Some(target) = target {
                let target = target.with_timeout(timeout).with_tls(store.tls.clone());
                return Self::redis(settings, target);
            }
        }
        #[cfg(not(feature = "redis-store"))]
        let _ = store;
        Self::in_process(settings)
    }

    fn start(settings: &TelemetrySettings, sink: Sink) -> Self {
        let local = match &sink {
            Sink::Memory => MemoryView::new(settings.top_keys),
            #[cfg(feature = "redis-store")]
            Sink::Redis(_) => {
                MemoryView::with_max_keep(settings.top_keys, memory_view::KEEP_BESIDE_REDIS)
            }
        };
        let inner = Arc::new(Inner {
            batch: sharded::ShardedBatch::new(settings.top_keys),
            sink,
            local,
            unavailable: Mutex::new(None),
            settings: settings.clone(),
            flushing: tokio::sync::Mutex::new(()),
            closed: AtomicBool::new(false),
            policy: Mutex::new(None),
            instance: instance_name().into(),
            outage: Mutex::new(None),
            last_outage: Mutex::new(None),
        });
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(flush_loop(Arc::downgrade(&inner), settings.flush_interval));
        }
        Self {
            inner: Some(inner),
            limiter: None,
        }
    }

    /// This pipeline, recording its metrics under `limiter="<name>"` when
    /// `name` is `Some` (a named limiter), without that label when `None`.
    /// Clones share the fleet view; only this handle carries the name.
    pub fn named(mut self, name: Option<&str>) -> Self {
        self.limiter = name.map(Arc::from);
        self
    }

    /// The limiter's name its metrics carry, if it has one.
    pub fn limiter_name(&self) -> Option<&str> {
        self.limiter.as_deref()
    }

    /// The name as the metric functions take it.
    pub(crate) fn limiter(&self) -> Option<&Arc<str>> {
        self.limiter.as_ref()
    }

    /// Records one decision: Prometheus metrics, then the interval's
    /// aggregate. Never blocks beyond one short lock, never fails.
    pub fn record(&self, event: &Event) {
        metrics::record_named_event(event, self.limiter.as_ref());
        if let Some(inner) = &self.inner {
            inner.batch.add(event);
        }
    }

    /// Whether events' identities are kept (the fleet view's top keys): a
    /// metrics-only pipeline never reads them, so callers may leave them
    /// empty.
    pub(crate) fn keeps_identities(&self) -> bool {
        self.inner.is_some()
    }

    /// Counts a breaker trip in Prometheus and in the fleet view.
    pub fn record_breaker_trip(&self, shard: &str) {
        metrics::record_breaker_trip(shard);
    }

    /// Flushes the current aggregate into the fleet view now.
    /// Names the policy this instance runs in the fleet view from the next
    /// flush on.
    pub fn set_policy_version(&self, version: &crate::policy::PolicyVersion) {
        if let Some(inner) = &self.inner {
            *inner.policy.lock() = Some(format!("{}#{}", version.version, version.hash).into());
        }
    }

    /// Flushes the current aggregate into the fleet view now.
    pub async fn flush(&self) {
        if let Some(inner) = &self.inner {
            inner.flush().await;
        }
    }

    /// Stops the flush task and flushes what is left (bounded by the Redis
    /// timeout). Events recorded afterwards reach Prometheus, and the fleet
    /// view only through an explicit [`Telemetry::flush`].
    pub async fn shutdown(&self) {
        if let Some(inner) = &self.inner {
            inner.closed.store(true, Ordering::SeqCst);
            inner.flush().await;
        }
    }

    /// What waits for the next flush; bounded whatever the traffic.
    pub fn backlog(&self) -> Backlog {
        self.inner
            .as_ref()
            .map_or(Backlog::default(), |i| i.batch.backlog())
    }

    /// A reader of the fleet view this pipeline writes.
    pub fn fleet(&self) -> FleetReader {
        FleetReader {
            inner: self.inner.clone(),
        }
    }
}

impl Inner {
    async fn flush(&self) {
        let _one_at_a_time = self.flushing.lock().await;
        let batch = self.batch.take();
        metrics::record_dropped(DropReason::Overflow, batch.overflow);
        let mut flat = Flat::from_batch(batch, aggregate::take_trips(), aggregate::take_breakers());
        let now = unix_now();
        #[cfg_attr(not(feature = "redis-store"), allow(unused_variables))]
        let flat = if flat.is_empty() {
            None
        } else {
            if let Some(policy) = self.policy.lock().clone() {
                flat.policies.push((policy.to_string(), 1));
            }
            flat.instances
                .push((self.instance.to_string(), flat.events));
            flat.reported.push((self.instance.to_string(), now));
            self.local.apply(now, &flat);
            Some(flat)
        };
        match &self.sink {
            Sink::Memory => {}
            #[cfg(feature = "redis-store")]
            Sink::Redis(sink) => {
                // Even without a new batch: batches an outage kept wait
                // for the first flush Redis answers.
                let kept = sink.pending();
                if flat.is_none() && kept.buckets == 0 {
                    return;
                }
                match sink.write(now, flat).await {
                    Err(e) => self.mark_unavailable(now, &e),
                    Ok(()) => {
                        if let Some(o) = self.outage.lock().take() {
                            *self.last_outage.lock() = Some(Outage {
                                since: o.since,
                                // Not `now`: the write may have waited
                                // for Redis to come back.
                                until: unix_now(),
                                reason: o.reason,
                                kept_events: kept.events,
                                kept_buckets: kept.buckets,
                            });
                        }
                    }
                }
            }
        }
    }

    /// Remembers the first failure of an outage and the latest reason.
    #[cfg(feature = "redis-store")]
    fn mark_unavailable(&self, now: u64, e: &TelemetryError) {
        let reason = e.to_string();
        for cell in [&self.unavailable, &self.outage] {
            let mut u = cell.lock();
            match &mut *u {
                Some(known) => known.reason = reason.clone(),
                None => {
                    *u = Some(Unavailable {
                        since: now,
                        reason: reason.clone(),
                    })
                }
            }
        }
    }
}

async fn flush_loop(inner: Weak<Inner>, every: std::time::Duration) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tick.tick().await;
        // Only a weak reference between ticks: dropping every `Telemetry`
        // ends the task; `shutdown` ends it too.
        let Some(i) = inner.upgrade() else { return };
        if i.closed.load(Ordering::SeqCst) {
            return;
        }
        i.flush().await;
    }
}

/// Reads the fleet view: every instance's flushed data, merged.
#[derive(Clone)]
pub struct FleetReader {
    inner: Option<Arc<Inner>>,
}

impl std::fmt::Debug for FleetReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FleetReader").finish_non_exhaustive()
    }
}

impl FleetReader {
    /// The fleet view over `[from_unix_s, to_unix_s]`: 10 s buckets for
    /// ranges within the last hour, 1 min buckets otherwise. An empty view
    /// (all zeros) for a metrics-only pipeline.
    ///
    /// Never fails because Redis is away: when the fleet view does not
    /// answer within [`READ_BUDGET`], the answer is this instance's
    /// in-process view, with `source.fleet_unavailable` saying since when
    /// and why. Fails only on an inverted range.
    pub async fn query(
        &self,
        from_unix_s: u64,
        to_unix_s: u64,
    ) -> Result<FleetStats, TelemetryError> {
        if from_unix_s > to_unix_s {
            return Err(TelemetryError::InvalidRange {
                from: from_unix_s,
                to: to_unix_s,
            });
        }
        let now = unix_now();
        let res = Resolution::for_range(from_unix_s, to_unix_s, now);
        let starts = res.starts(from_unix_s, to_unix_s, now);
        let Some(inner) = &self.inner else {
            let mut s = fleet::merge(from_unix_s, to_unix_s, res, starts, &[], 0);
            s.source.kind = "disabled";
            return Ok(s);
        };
        let top = inner.settings.top_keys;
        let local = |kind: &'static str, unavailable: Option<Unavailable>| {
            let buckets = inner.local.read(res, &starts);
            let mut s = fleet::merge(from_unix_s, to_unix_s, res, starts.clone(), &buckets, top);
            s.source = ViewSource {
                kind,
                fleet_unavailable: unavailable,
                ..ViewSource::default()
            };
            s
        };
        match &inner.sink {
            Sink::Memory => {
                // One instance is the fleet: show what is not flushed yet.
                inner.flush().await;
                Ok(local("in_process", None))
            }
            #[cfg(feature = "redis-store")]
            Sink::Redis(sink) => {
                let mut s = match sink.read(res, &starts, READ_BUDGET).await {
                    Ok(mut partial) => {
                        *inner.unavailable.lock() = None;
                        // Buckets a lost cluster shard holds: this
                        // instance's own part of them, marked stale.
                        if !partial.missing.is_empty() {
                            partial
                                .buckets
                                .extend(inner.local.read(res, &partial.missing));
                        }
                        let mut s = fleet::merge(
                            from_unix_s,
                            to_unix_s,
                            res,
                            starts.clone(),
                            &partial.buckets,
                            top,
                        );
                        s.source.kind = "fleet";
                        s.source.stale_buckets = partial.missing;
                        s.source.stale_reason = partial.reason;
                        s
                    }
                    Err(e) => {
                        tracing::debug!(error = %e, "fleet view unavailable; answering from this instance");
                        inner.mark_unavailable(now, &e);
                        let why = inner.unavailable.lock().clone();
                        local("instance", why)
                    }
                };
                let pending = sink.pending();
                s.source.unflushed_events = pending.events;
                s.source.unflushed_buckets = pending.buckets;
                s.source.dropped_events = pending.dropped;
                s.source.last_outage = inner.last_outage.lock().clone();
                Ok(s)
            }
        }
    }
}
