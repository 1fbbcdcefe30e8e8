//! The built-in dashboard: askama pages with a JSON API beside each view.
//!
//! `GET /` (the page), `GET /api/stats?range=15m` (the fleet view, the
//! same [`FleetStats`](crate::telemetry::FleetStats) the page draws),
//! `GET /api/policy` (tiers and limits), `GET /api/breakers` (this
//! instance's breaker per shard). Mount it with
//! `Router::nest("/dashboard", limiter.dashboard())`.
//!
//! Never dark: when the fleet view in Redis does not answer within
//! [`READ_BUDGET`](crate::telemetry::READ_BUDGET), the page and
//! `/api/stats` answer from this instance's in-process view, and say so
//! (`source.fleet_unavailable`: since when and why).
//!
//! It answers loopback clients only unless `allow_remote = true`, requires
//! `Authorization: Bearer <token>` (or one `?token=` visit, traded for a
//! session cookie) when a token is configured, and escapes everything it
//! prints.

mod auth;
mod view;

use askama::Template;
use axum::Router;
use axum::extract::{Query, State};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;
use axum::{Json, middleware};
use http::StatusCode;
use serde::Deserialize;

use crate::Limiter;
use crate::telemetry::unix_now;

pub use view::{DashboardPage, PolicyView};

/// The time ranges the dashboard offers.
pub const RANGES: [(&str, u64); 6] = [
    ("5m", 300),
    ("15m", 900),
    ("1h", 3_600),
    ("6h", 21_600),
    ("24h", 86_400),
    ("2d", 172_800),
];

#[derive(Debug, Deserialize)]
struct RangeQuery {
    range: Option<String>,
}

impl RangeQuery {
    fn range(&self) -> (&'static str, u64) {
        let asked = self.range.as_deref().unwrap_or("15m");
        RANGES
            .iter()
            .copied()
            .find(|(name, _)| *name == asked)
            .unwrap_or(RANGES[1])
    }
}

impl Limiter {
    /// The dashboard's router, to nest under a path of your choice in a
    /// router of any state: `app.nest("/dashboard", limiter.dashboard())`.
    pub fn dashboard<S: Clone + Send + Sync + 'static>(&self) -> Router<S> {
        router(self.clone())
    }
}

fn router<S: Clone + Send + Sync + 'static>(limiter: Limiter) -> Router<S> {
    let guard = auth::Guard {
        limiter: limiter.clone(),
        sessions: auth::Sessions::default(),
    };
    Router::new()
        .route("/", get(page))
        .route("/api/stats", get(stats))
        .route("/api/policy", get(policy))
        .route("/api/breakers", get(breakers))
        .route("/api/leases", get(leases))
        .layer(middleware::from_fn_with_state(guard, auth::guard))
        .with_state(limiter)
}

/// Why a dashboard view could not be shown.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DashboardError {
    /// The fleet view could not be read.
    #[error("the fleet view is unavailable: {0}")]
    Fleet(#[from] crate::telemetry::TelemetryError),
    /// The page could not be rendered.
    #[error("the page could not be rendered: {0}")]
    Render(#[from] askama::Error),
}

impl IntoResponse for DashboardError {
    fn into_response(self) -> Response {
        tracing::warn!(error = %self, "dashboard");
        (StatusCode::SERVICE_UNAVAILABLE, self.to_string()).into_response()
    }
}

/// The fleet view over the last `secs` seconds, with the headline rates of
/// the period before it (as long) for the trend. The previous period is
/// only read when the current one came from the same source, so a trend
/// never compares the fleet with one instance.
async fn with_trend(
    limiter: &Limiter,
    now: u64,
    secs: u64,
) -> Result<crate::telemetry::FleetStats, DashboardError> {
    let fleet = limiter.telemetry().fleet();
    let from = now.saturating_sub(secs);
    let mut stats = fleet.query(from, now).await?;
    stats.slots_held = crate::telemetry::inflight::slots_held(&limiter.policy());
    if from > 0 {
        if let Ok(before) = fleet.query(from.saturating_sub(secs), from - 1).await {
            if before.source.kind == stats.source.kind {
                stats.previous = Some(before.rates());
            }
        }
    }
    Ok(stats)
}

async fn page(
    State(limiter): State<Limiter>,
    Query(q): Query<RangeQuery>,
) -> Result<Html<String>, DashboardError> {
    let (range, secs) = q.range();
    let now = unix_now();
    let stats = with_trend(&limiter, now, secs).await?;
    let page = DashboardPage::new(&limiter, stats, range, now);
    Ok(Html(page.render()?))
}

async fn stats(
    State(limiter): State<Limiter>,
    Query(q): Query<RangeQuery>,
) -> Result<Json<crate::telemetry::FleetStats>, DashboardError> {
    let (_, secs) = q.range();
    Ok(Json(with_trend(&limiter, unix_now(), secs).await?))
}

/// `/api/policy`: the tiers and limits, and beside them (`live`) the
/// policy's version and how its reloads went.
#[derive(serde::Serialize)]
struct PolicyResponse {
    #[serde(flatten)]
    view: PolicyView,
    live: crate::PolicyStatus,
}

async fn policy(State(limiter): State<Limiter>) -> Json<PolicyResponse> {
    Json(PolicyResponse {
        view: PolicyView::of(&limiter.policy()),
        live: limiter.policy_status(),
    })
}

/// `/api/leases`: the keys this instance serves from leases, hottest
/// first (identities in their display form, masked by default).
async fn leases(State(limiter): State<Limiter>) -> Json<Vec<crate::lease::HotKey>> {
    Json(limiter.hot_keys())
}

/// This instance's breakers: every configured shard (closed until first
/// used) and every shard seen since, each with its state.
async fn breakers(State(limiter): State<Limiter>) -> Json<serde_json::Value> {
    let mut states: serde_json::Map<String, serde_json::Value> = serde_json::Map::new();
    if limiter.store().kind() != "memory" {
        for shard in crate::telemetry::metrics::configured_shards(&limiter.policy()) {
            states.insert(shard, "closed".into());
        }
    }
    for (shard, state) in limiter.breaker_states() {
        states.insert(shard.to_string(), state.as_str().into());
    }
    Json(serde_json::Value::Object(states))
}
