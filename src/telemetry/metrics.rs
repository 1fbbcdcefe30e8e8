//! Prometheus metrics: every metric and label name, their descriptions, the
//! global recorder and the functions other parts of ratewatch call.
//!
//! Labels are bounded: tier and limit names come from the policy, routes
//! are rule patterns, shards are `memory` or a Redis `host:port`. No metric
//! is ever labelled by identity.
//!
//! ```
//! let handle = ratewatch::telemetry::metrics::install_prometheus().unwrap();
//! ratewatch::telemetry::metrics::record_breaker_state("127.0.0.1:6379", 2);
//! let text = ratewatch::telemetry::metrics::render(&handle);
//! assert!(text.contains("ratewatch_breaker_state{shard=\"127.0.0.1:6379\"} 2"));
//! ```

use std::sync::{Arc, OnceLock};

use crate::policy::{FailurePolicy, Policy, StoreKind};
use std::time::Duration;

use metrics::{Label, Unit, counter, describe_counter, describe_gauge, describe_histogram, gauge};
use metrics_exporter_prometheus::{BuildError, Matcher, PrometheusBuilder, PrometheusHandle};

use super::Event;
use super::labelled::Series;

/// Decisions made: counter {tier, route, shard, outcome}.
pub const DECISIONS_TOTAL: &str = "ratewatch_decisions_total";
/// Blocks per limit (enforced or shadow): counter {tier, limit}.
pub const LIMIT_EXCEEDED_TOTAL: &str = "ratewatch_limit_exceeded_total";
/// Decisions answered by the failure policy: counter {shard, reason, policy}.
pub const FALLBACKS_TOTAL: &str = "ratewatch_fallbacks_total";
/// Redis round trips: histogram {shard, op}, in seconds.
pub const REDIS_RTT_SECONDS: &str = "ratewatch_redis_rtt_seconds";
/// Circuit breaker state per shard: gauge, 0 closed, 1 half-open, 2 open.
pub const BREAKER_STATE: &str = "ratewatch_breaker_state";
/// Times a shard's breaker opened: counter {shard}.
pub const BREAKER_TRIPS_TOTAL: &str = "ratewatch_breaker_trips_total";
/// Lua scripts reloaded after `NOSCRIPT`: counter {shard}.
pub const SCRIPT_RELOADS_TOTAL: &str = "ratewatch_script_reloads_total";
/// Live memory-store entries evicted to stay under `[store] max_entries`
/// (each a counter reset): counter {shard}.
pub const STORE_EVICTIONS_TOTAL: &str = "ratewatch_store_evictions_total";
/// Decision events the fleet view lost: counter {reason}.
pub const TELEMETRY_DROPPED_TOTAL: &str = "ratewatch_telemetry_dropped_total";
/// Always 1, labelled with the crate version: gauge {version}.
pub const BUILD_INFO: &str = "ratewatch_build_info";

/// Label: the tier name.
pub const LABEL_TIER: &str = "tier";
/// Label: the matched route rule's pattern, or `*`.
pub const LABEL_ROUTE: &str = "route";
/// Label: `memory` or the Redis node (`host:port`).
pub const LABEL_SHARD: &str = "shard";
/// Label: the decision's [`Outcome`](super::Outcome) (`allowed`, `blocked` ...).
pub const LABEL_OUTCOME: &str = "outcome";
/// Label: the limit's name.
pub const LABEL_LIMIT: &str = "limit";
/// Label: why a fallback or a drop happened.
pub const LABEL_REASON: &str = "reason";
/// Label: the failure policy that answered (`open`, `closed`, `local`).
pub const LABEL_POLICY: &str = "policy";
/// Label: the Redis operation timed (`decide` or `telemetry`).
pub const LABEL_OP: &str = "op";
/// Label: the crate version.
pub const LABEL_VERSION: &str = "version";

/// Upper bounds, in seconds, of the `ratewatch_redis_rtt_seconds` buckets.
/// The fleet view counts round trips into the same buckets.
pub const RTT_BUCKETS: [f64; 14] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0,
];

/// How often the global recorder's upkeep runs.
pub const UPKEEP_INTERVAL: Duration = Duration::from_secs(5);

/// The Redis operation a round trip belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RttOp {
    /// A rate-limit decision.
    Decide,
    /// A telemetry flush.
    Telemetry,
}

impl RttOp {
    /// The `op` label value.
    pub fn as_str(self) -> &'static str {
        match self {
            RttOp::Decide => "decide",
            RttOp::Telemetry => "telemetry",
        }
    }
}

/// Why the fleet view lost events (the `reason` of
/// `ratewatch_telemetry_dropped_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DropReason {
    /// Redis did not answer a flush in time.
    Timeout,
    /// Redis could not be reached or answered an error.
    Error,
    /// More distinct label combinations in one interval than the cap.
    Overflow,
    /// Batches kept while Redis was away outgrew their cap; the oldest went.
    BufferFull,
}

impl DropReason {
    /// The `reason` label value.
    pub fn as_str(self) -> &'static str {
        match self {
            DropReason::Timeout => "timeout",
            DropReason::Error => "error",
            DropReason::Overflow => "overflow",
            DropReason::BufferFull => "buffer_full",
        }
    }
}

/// Describes every metric to the current recorder (help text and unit).
pub fn describe() {
    describe_counter!(
        DECISIONS_TOTAL,
        "Rate-limit decisions, by tier, route, shard and outcome."
    );
    describe_counter!(
        LIMIT_EXCEEDED_TOTAL,
        "Requests a limit blocked (enforced or shadow), by tier and limit."
    );
    describe_counter!(
        FALLBACKS_TOTAL,
        "Decisions answered by the failure policy, by shard, reason and policy."
    );
    describe_histogram!(
        REDIS_RTT_SECONDS,
        Unit::Seconds,
        "Redis round-trip time, by shard and operation (decide, telemetry)."
    );
    describe_gauge!(
        BREAKER_STATE,
        "Circuit breaker state per shard: 0 closed, 1 half-open, 2 open."
    );
    describe_counter!(
        BREAKER_TRIPS_TOTAL,
        "Times a shard's circuit breaker opened."
    );
    describe_counter!(
        SCRIPT_RELOADS_TOTAL,
        "Lua scripts reloaded after NOSCRIPT, by shard."
    );
    describe_counter!(
        STORE_EVICTIONS_TOTAL,
        "Live memory-store entries evicted to stay under max_entries (each a counter reset), by shard."
    );
    describe_counter!(
        TELEMETRY_DROPPED_TOTAL,
        "Decision events the fleet view lost, by reason."
    );
    describe_gauge!(
        BUILD_INFO,
        "Always 1; the version label names the ratewatch build."
    );
    super::rls::describe();
    describe_store_usage();
}

/// A builder with ratewatch's histogram buckets, for a global or a local
/// recorder (`prometheus_builder()?.build_recorder()` in tests).
pub fn prometheus_builder() -> Result<PrometheusBuilder, BuildError> {
    with_ratewatch_buckets(PrometheusBuilder::new())
}

/// Installs the Prometheus recorder globally, describes every metric and
/// sets `ratewatch_build_info`. Idempotent: later calls return the same
/// handle. Upkeep runs every [`UPKEEP_INTERVAL`] on the current tokio
/// runtime if there is one (otherwise call `handle.run_upkeep()` yourself).
///
/// Fails if another recorder was installed globally first.
pub fn install_prometheus() -> Result<PrometheusHandle, BuildError> {
    static INSTALL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    if let Some(h) = HANDLE.get() {
        return Ok(h.clone());
    }
    let _guard = INSTALL.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(h) = HANDLE.get() {
        return Ok(h.clone());
    }
    let handle = prometheus_builder()?.install_recorder()?;
    super::counters::note_own_recorder();
    describe();
    record_build_info();
    if let Ok(rt) = tokio::runtime::Handle::try_current() {
        let upkeep = handle.clone();
        rt.spawn(async move {
            let mut tick = tokio::time::interval(UPKEEP_INTERVAL);
            loop {
                tick.tick().await;
                upkeep.run_upkeep();
            }
        });
    }
    Ok(HANDLE.get_or_init(|| handle).clone())
}

/// Sets `ratewatch_build_info{version}` to 1 on the current recorder.
pub fn record_build_info() {
    gauge!(BUILD_INFO, LABEL_VERSION => env!("CARGO_PKG_VERSION")).set(1.0);
}

/// The Prometheus text exposition, for `/metrics`.
pub fn render(handle: &PrometheusHandle) -> String {
    handle.render()
}

/// Sets a shard's breaker state: 0 closed, 1 half-open, 2 open.
pub fn record_breaker_state(shard: &str, state: u8) {
    gauge!(BREAKER_STATE, LABEL_SHARD => shard.to_owned()).set(f64::from(state));
    super::aggregate::note_breaker_state(shard, state);
}

/// Counts a breaker trip, in Prometheus and in the fleet view (the next
/// flush of the fleet view in this process carries it).
pub fn record_breaker_trip(shard: &str) {
    counter!(BREAKER_TRIPS_TOTAL, LABEL_SHARD => shard.to_owned()).increment(1);
    super::aggregate::pending_trip(shard);
}

/// Counts a Lua script reload after `NOSCRIPT`.
pub fn record_script_reload(shard: &str) {
    counter!(SCRIPT_RELOADS_TOTAL, LABEL_SHARD => shard.to_owned()).increment(1);
}

/// Counts `n` memory-store evictions on `shard` (0 makes the series exist).
pub fn record_store_evictions(shard: &str, n: u64) {
    counter!(STORE_EVICTIONS_TOTAL, LABEL_SHARD => shard.to_owned()).increment(n);
}

/// Records one Redis round trip.
pub fn record_redis_rtt(shard: &str, op: RttOp, rtt: Duration) {
    let series = Series::two(
        REDIS_RTT_SECONDS,
        (LABEL_SHARD, shard),
        (LABEL_OP, op.as_str()),
    );
    super::labelled::observe(&series, rtt.as_secs_f64());
}

/// Counts `events` decision events the fleet view lost.
pub fn record_dropped(reason: DropReason, events: u64) {
    if events > 0 {
        counter!(TELEMETRY_DROPPED_TOTAL, LABEL_REASON => reason.as_str()).increment(events);
    }
}

/// The Prometheus side of one decision: decisions, exceeded limits,
/// fallbacks and the decision's Redis round trip.
pub fn record_event(event: &Event) {
    record_named_event(event, None);
}

/// [`record_event`] for a limiter named `limiter`: every series also
/// carries `limiter="<name>"`. `None` records exactly what
/// [`record_event`] does, no label added.
pub fn record_named_event(event: &Event, limiter: Option<&Arc<str>>) {
    if super::counters::count_decision(event, limiter) {
        return record_event_rest(event, limiter);
    }
    let mut labels = vec![
        Label::new(LABEL_TIER, event.tier.clone()),
        Label::new(LABEL_ROUTE, event.route.clone()),
        Label::new(LABEL_SHARD, event.shard.clone()),
        Label::new(LABEL_OUTCOME, event.outcome.as_str()),
    ];
    push_limiter(&mut labels, limiter);
    counter!(DECISIONS_TOTAL, labels).increment(1);
    record_event_rest(event, limiter);
}

/// The name `policy`'s limiter labels its series with, if it is named.
pub(crate) fn zero_limiter(policy: &Policy) -> Option<Arc<str>> {
    policy.telemetry.limiter_name.as_deref().map(Arc::from)
}

/// Appends `limiter="<name>"` to `labels` when the limiter is named.
pub(crate) fn push_limiter(labels: &mut Vec<Label>, limiter: Option<&Arc<str>>) {
    if let Some(name) = limiter {
        labels.push(Label::new(LABEL_LIMITER, name.clone()));
    }
}

/// Everything of [`record_named_event`] but the decision counter.
fn record_event_rest(event: &Event, limiter: Option<&Arc<str>>) {
    for limit in &event.exceeded {
        let mut labels = vec![
            Label::new(LABEL_TIER, event.tier.clone()),
            Label::new(LABEL_LIMIT, limit.clone()),
        ];
        push_limiter(&mut labels, limiter);
        counter!(LIMIT_EXCEEDED_TOTAL, labels).increment(1);
    }
    if let Some((reason, policy)) = event.fallback {
        let mut labels = vec![
            Label::new(LABEL_SHARD, event.shard.clone()),
            Label::new(LABEL_REASON, reason.as_str()),
            Label::new(LABEL_POLICY, policy.as_str()),
        ];
        push_limiter(&mut labels, limiter);
        counter!(FALLBACKS_TOTAL, labels).increment(1);
    }
    if let Some(rtt) = event.redis_rtt {
        // Every decision on Redis: the histogram's handle is kept per
        // thread, not looked up by freshly built labels.
        let series = Series {
            limiter,
            ..Series::two(
                REDIS_RTT_SECONDS,
                (LABEL_SHARD, &event.shard),
                (LABEL_OP, RttOp::Decide.as_str()),
            )
        };
        super::labelled::observe(&series, rtt.as_secs_f64());
    }
}

// ---------------------------------------------------------------------------
// The handle `/metrics` renders, and applications with their own recorder.
// ---------------------------------------------------------------------------

/// The handle ratewatch renders: its own recorder's, or the application's
/// (see [`use_handle`]).
static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();

/// Adds ratewatch's histogram buckets to an application's own builder, so
/// `ratewatch_redis_rtt_seconds` is exported as a histogram (the shipped
/// p99 panels and the slow-Redis alert need its `_bucket` series), not as a
/// summary.
///
/// The supported way to embed ratewatch in a service that owns its
/// Prometheus recorder: build it with this, install it, hand the handle to
/// [`use_handle`], and only then build the limiter.
///
/// ```
/// use metrics_exporter_prometheus::PrometheusBuilder;
/// use ratewatch::telemetry::metrics;
/// let recorder = metrics::with_ratewatch_buckets(PrometheusBuilder::new())
///     .unwrap()
///     .build_recorder();
/// metrics::use_handle(recorder.handle());
/// // metrics::set_global_recorder(recorder) in the application, then
/// // Limiter::new(..), then .route("/metrics", get(limiter.metrics_handler()))
/// ```
pub fn with_ratewatch_buckets(builder: PrometheusBuilder) -> Result<PrometheusBuilder, BuildError> {
    builder
        .set_buckets_for_metric(Matcher::Full(REDIS_RTT_SECONDS.into()), &RTT_BUCKETS)?
        .set_buckets_for_metric(
            Matcher::Full(super::lease::LEASE_RENEW_SECONDS.into()),
            &RTT_BUCKETS,
        )?
        .set_buckets_for_metric(
            Matcher::Full(super::rls::RLS_REQUEST_SECONDS.into()),
            &super::rls::RLS_BUCKETS,
        )
}

/// Makes `/metrics` (`Limiter::metrics_handler`) render `handle`, the
/// handle of a recorder the application installed itself, and describes
/// ratewatch's metrics on the current recorder. Call it before building a
/// limiter. Returns `false` (and changes nothing) if a handle was already
/// chosen, by an earlier call or by ratewatch installing its own recorder.
pub fn use_handle(handle: PrometheusHandle) -> bool {
    if HANDLE.set(handle).is_err() {
        return false;
    }
    describe();
    record_build_info();
    true
}

/// The handle `/metrics` renders: the one given to [`use_handle`], else
/// ratewatch's own recorder, installed on first use. `None` when another
/// recorder was installed and its handle was not handed over.
pub fn handle() -> Option<PrometheusHandle> {
    HANDLE.get().cloned().or_else(|| install_prometheus().ok())
}

/// Whether a rendered exposition shows the round-trip histogram as a
/// summary: the recorder was built without [`with_ratewatch_buckets`].
pub fn rtt_rendered_as_summary(text: &str) -> bool {
    text.lines()
        .any(|l| l.starts_with(REDIS_RTT_SECONDS) && l.contains("quantile=\""))
}

// ---------------------------------------------------------------------------
// Every metric at zero from start-up.
// ---------------------------------------------------------------------------

/// Most `ratewatch_decisions_total` series [`register_at_zero`] creates; a
/// policy with more tier x route x shard combinations gets its decision
/// series on first use only.
pub const MAX_ZERO_DECISION_SERIES: usize = 2_000;

/// The `shard` labels a policy's store is configured with: `memory`, the
/// node of a `redis` store, or every seed node of a cluster.
pub fn configured_shards(policy: &Policy) -> Vec<String> {
    match policy.store.kind {
        StoreKind::Memory => vec!["memory".to_owned()],
        StoreKind::Redis => vec![url_host_port(
            policy
                .store
                .url
                .as_deref()
                .unwrap_or(crate::policy::DEFAULT_REDIS_URL),
        )],
        StoreKind::RedisCluster => policy
            .store
            .nodes
            .iter()
            .map(|n| url_host_port(n))
            .collect(),
        #[allow(unreachable_patterns)]
        _ => Vec::new(),
    }
}

fn url_host_port(url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let rest = rest.rsplit_once('@').map_or(rest, |(_, r)| r);
    rest.split('/').next().unwrap_or(rest).to_owned()
}

/// Creates, at zero, every series whose labels are known at start-up, so
/// Grafana shows 0 rather than "No data" and `rate()` sees the first
/// increment: per configured shard (the memory store's too, so every
/// family a shipped board or rule uses exists on every store) the breaker
/// state (closed) and trips, script reloads, fallbacks for every reason
/// and every failure policy the policy uses, and evictions;
/// telemetry drops per reason; limits exceeded per
/// tier and limit; decisions per tier, route, shard and outcome (up to
/// [`MAX_ZERO_DECISION_SERIES`]); and the round-trip histogram per shard.
pub fn register_at_zero(policy: &Policy) {
    super::lease::register_at_zero();
    super::cost::register_at_zero(policy);
    super::rls::register_policy(policy);
    let shards = configured_shards(policy);
    super::inflight::register_at_zero(policy, &shards);
    register_store_usage_at_zero(&shards);
    let redis_shards: Vec<&String> = shards.iter().filter(|s| *s != "memory").collect();
    // The series a named limiter labels with its name exist at zero under it.
    let limiter = zero_limiter(policy);
    let limiter = limiter.as_ref();
    let mut policies: Vec<FailurePolicy> = vec![policy.resilience.on_store_failure];
    for r in &policy.routes {
        if let Some(p) = r.on_store_failure {
            if !policies.contains(&p) {
                policies.push(p);
            }
        }
    }
    // The memory shard too: it has no breaker and never falls back, but a
    // shipped board or rule must find every family it uses, at zero.
    for shard in &shards {
        let shard = shard.clone();
        gauge!(BREAKER_STATE, LABEL_SHARD => shard.clone()).set(0.0);
        if redis_shards.contains(&&shard) {
            super::aggregate::note_breaker_state(&shard, 0);
        }
        counter!(BREAKER_TRIPS_TOTAL, LABEL_SHARD => shard.clone()).increment(0);
        counter!(SCRIPT_RELOADS_TOTAL, LABEL_SHARD => shard.clone()).increment(0);
        for reason in [
            super::FallbackReason::Timeout,
            super::FallbackReason::Error,
            super::FallbackReason::BreakerOpen,
        ] {
            for p in &policies {
                let mut labels = vec![
                    Label::new(LABEL_SHARD, shard.clone()),
                    Label::new(LABEL_REASON, reason.as_str()),
                    Label::new(LABEL_POLICY, p.as_str()),
                ];
                push_limiter(&mut labels, limiter);
                counter!(FALLBACKS_TOTAL, labels).increment(0);
            }
        }
        for op in [RttOp::Decide, RttOp::Telemetry] {
            // Registering is enough: the histogram renders with zero counts.
            let mut labels = vec![
                Label::new(LABEL_SHARD, shard.clone()),
                Label::new(LABEL_OP, op.as_str()),
            ];
            // Decide round trips are the limiter's; telemetry flushes the store's.
            if op == RttOp::Decide {
                push_limiter(&mut labels, limiter);
            }
            let _ = metrics::histogram!(REDIS_RTT_SECONDS, labels);
        }
    }
    // Evictions: the memory store, or the local fallback's store of a
    // Redis shard (0 while no route falls back locally), so the boards'
    // eviction panels and rules see the family on every store.
    for shard in &shards {
        counter!(STORE_EVICTIONS_TOTAL, LABEL_SHARD => shard.clone()).increment(0);
    }
    for reason in [
        DropReason::Timeout,
        DropReason::Error,
        DropReason::Overflow,
        DropReason::BufferFull,
    ] {
        counter!(TELEMETRY_DROPPED_TOTAL, LABEL_REASON => reason.as_str()).increment(0);
    }
    let routes: Vec<String> = policy
        .routes
        .iter()
        .filter(|r| !r.exempt)
        .map(|r| r.label().to_owned())
        .chain(std::iter::once("*".to_owned()))
        .collect();
    let outcomes = super::Outcome::ALL;
    let decision_series = policy.tiers.len() * routes.len() * shards.len() * outcomes.len();
    for tier in &policy.tiers {
        let mut limits: Vec<&str> = tier.limits.iter().map(|l| l.name.as_str()).collect();
        for r in &policy.routes {
            limits.extend(r.limits.iter().map(|l| l.name.as_str()));
        }
        limits.sort_unstable();
        limits.dedup();
        for limit in limits {
            let mut labels = vec![
                Label::new(LABEL_TIER, tier.name.clone()),
                Label::new(LABEL_LIMIT, limit.to_owned()),
            ];
            push_limiter(&mut labels, limiter);
            counter!(LIMIT_EXCEEDED_TOTAL, labels).increment(0);
        }
        if decision_series > MAX_ZERO_DECISION_SERIES {
            continue;
        }
        for route in &routes {
            for shard in &shards {
                for o in outcomes {
                    let mut labels = vec![
                        Label::new(LABEL_TIER, tier.name.clone()),
                        Label::new(LABEL_ROUTE, route.clone()),
                        Label::new(LABEL_SHARD, shard.clone()),
                        Label::new(LABEL_OUTCOME, o.as_str()),
                    ];
                    push_limiter(&mut labels, limiter);
                    counter!(DECISIONS_TOTAL, labels).increment(0);
                }
            }
        }
    }
}

// The live policy: reloads, the version in force, settings waiting for a
// restart. Kept apart from the decision metrics above.

/// Policy reloads: counter {result = `ok` | `error`}.
pub const CONFIG_RELOADS_TOTAL: &str = "ratewatch_config_reloads_total";
/// 1 if the latest reload applied, 0 if it was refused: gauge.
pub const CONFIG_LAST_RELOAD_SUCCESSFUL: &str = "ratewatch_config_last_reload_successful";
/// Settings changed in the policy file that wait for a restart: gauge.
pub const CONFIG_RESTART_REQUIRED: &str = "ratewatch_config_restart_required";
/// 1 for the policy in force, 0 for policies it replaced: gauge {version, hash}.
pub const POLICY_INFO: &str = "ratewatch_policy_info";
/// Label: a reload's result (`ok`, `error`).
pub const LABEL_RESULT: &str = "result";
/// Label: the policy's content hash.
pub const LABEL_HASH: &str = "hash";

/// Describes the live-policy metrics to the current recorder.
pub fn describe_policy() {
    describe_counter!(
        CONFIG_RELOADS_TOTAL,
        "Policy reloads, by result (ok, error). A refused reload keeps the previous policy."
    );
    describe_gauge!(
        CONFIG_LAST_RELOAD_SUCCESSFUL,
        "1 if the latest policy reload applied, 0 if it was refused."
    );
    describe_gauge!(
        CONFIG_RESTART_REQUIRED,
        "Settings changed in the policy file that only a restart applies (0 when none)."
    );
    describe_gauge!(
        POLICY_INFO,
        "1 for the policy in force (version and content hash), 0 for the ones it replaced."
    );
}

/// Label: the limiter's name (`[telemetry] limiter_name`), on every series
/// a named limiter records (decisions, units, in-flight slots, fallbacks,
/// reload status ...), so several limiters in one process each keep their
/// own. An unnamed limiter's series carry no such label.
pub const LABEL_LIMITER: &str = "limiter";

/// `labels`, plus `limiter` when the limiter is named.
fn named(mut labels: Vec<metrics::Label>, limiter: Option<&str>) -> Vec<metrics::Label> {
    if let Some(name) = limiter {
        labels.push(metrics::Label::new(LABEL_LIMITER, name.to_owned()));
    }
    labels
}

/// The live-policy metrics of a limiter that just started: reload counters
/// at zero for both results, the policy's info series at 1. `limiter` is
/// its name, if it has one.
pub fn init_policy_metrics(version: &str, hash: &str, limiter: Option<&str>) {
    for result in ["ok", "error"] {
        counter!(
            CONFIG_RELOADS_TOTAL,
            named(vec![metrics::Label::new(LABEL_RESULT, result)], limiter)
        )
        .increment(0);
    }
    gauge!(CONFIG_LAST_RELOAD_SUCCESSFUL, named(Vec::new(), limiter)).set(1.0);
    gauge!(CONFIG_RESTART_REQUIRED, named(Vec::new(), limiter)).set(0.0);
    record_policy_info(None, (version, hash), limiter);
}

/// Counts one reload and sets whether the latest one applied.
pub fn record_config_reload(ok: bool, limiter: Option<&str>) {
    let result = if ok { "ok" } else { "error" };
    counter!(
        CONFIG_RELOADS_TOTAL,
        named(vec![metrics::Label::new(LABEL_RESULT, result)], limiter)
    )
    .increment(1);
    gauge!(CONFIG_LAST_RELOAD_SUCCESSFUL, named(Vec::new(), limiter)).set(if ok {
        1.0
    } else {
        0.0
    });
}

/// Sets the number of settings waiting for a restart.
pub fn record_restart_required(settings: usize, limiter: Option<&str>) {
    gauge!(CONFIG_RESTART_REQUIRED, named(Vec::new(), limiter)).set(settings as f64);
}

/// Moves `ratewatch_policy_info` from `old` (set to 0: the exporter cannot
/// drop a series) to `new` (set to 1), each `(version, hash)`.
pub fn record_policy_info(old: Option<(&str, &str)>, new: (&str, &str), limiter: Option<&str>) {
    let labels = |version: &str, hash: &str| {
        named(
            vec![
                metrics::Label::new(LABEL_VERSION, version.to_owned()),
                metrics::Label::new(LABEL_HASH, hash.to_owned()),
            ],
            limiter,
        )
    };
    if let Some((version, hash)) = old {
        gauge!(POLICY_INFO, labels(version, hash)).set(0.0);
    }
    let (version, hash) = new;
    gauge!(POLICY_INFO, labels(version, hash)).set(1.0);
}

// Identity: tiers named by a resolver or a verified caller that the policy
// does not define.

/// Tier answers naming a tier the policy does not define: counter {source =
/// `resolver` | `identity`}. Never labelled by the name itself, which may
/// follow what a client sends.
pub const UNKNOWN_TIER_TOTAL: &str = "ratewatch_unknown_tier_total";
/// Label: what named the tier (`resolver`: the app's `TierResolver`;
/// `identity`: the tier a verified caller carried).
pub const LABEL_SOURCE: &str = "source";

/// Describes the identity metrics and sets them at zero for every source.
pub fn init_identity_metrics() {
    describe_counter!(
        UNKNOWN_TIER_TOTAL,
        "Requests whose resolver or verified caller named a tier the policy does not define \
         (refused with 403, or decided in [identity] unknown_tier), by source."
    );
    for source in ["resolver", "identity"] {
        counter!(UNKNOWN_TIER_TOTAL, LABEL_SOURCE => source).increment(0);
    }
}

/// Counts one answer naming a tier the policy does not define.
pub fn record_unknown_tier(source: &'static str) {
    counter!(UNKNOWN_TIER_TOTAL, LABEL_SOURCE => source).increment(1);
}

// ---- What the store holds (keys and memory per shard) ----------------------

/// Keys per shard, sampled every [`STORE_USAGE_EVERY`]: Redis `DBSIZE` (every
/// key of the database) or live memory-store entries: gauge {shard}.
pub const STORE_KEYS: &str = "ratewatch_store_keys";
/// Redis `used_memory` per shard, sampled: gauge {shard}, bytes (0 for the
/// memory store).
pub const STORE_MEMORY_USED_BYTES: &str = "ratewatch_store_memory_used_bytes";
/// Redis `maxmemory` per shard, sampled: gauge {shard}, bytes (0: no limit,
/// and for the memory store).
pub const STORE_MEMORY_MAX_BYTES: &str = "ratewatch_store_memory_max_bytes";

/// How often the store's keys and memory are sampled.
pub const STORE_USAGE_EVERY: Duration = Duration::from_secs(5);

fn describe_store_usage() {
    describe_gauge!(
        STORE_KEYS,
        "Keys the store holds, by shard (Redis DBSIZE, or live memory-store entries), sampled."
    );
    describe_gauge!(
        STORE_MEMORY_USED_BYTES,
        Unit::Bytes,
        "Redis used_memory by shard, sampled (0 for the memory store)."
    );
    describe_gauge!(
        STORE_MEMORY_MAX_BYTES,
        Unit::Bytes,
        "Redis maxmemory by shard (0: no limit, or the memory store), sampled."
    );
}

/// Sets the store gauges of one shard.
pub fn record_store_usage(shard: &str, keys: u64, used_bytes: u64, max_bytes: u64) {
    gauge!(STORE_KEYS, LABEL_SHARD => shard.to_owned()).set(keys as f64);
    gauge!(STORE_MEMORY_USED_BYTES, LABEL_SHARD => shard.to_owned()).set(used_bytes as f64);
    gauge!(STORE_MEMORY_MAX_BYTES, LABEL_SHARD => shard.to_owned()).set(max_bytes as f64);
}

/// The store gauges of every configured shard, at zero until sampled.
fn register_store_usage_at_zero(shards: &[String]) {
    for shard in shards {
        record_store_usage(shard, 0, 0, 0);
    }
}
