//! # ratewatch
//!
//! Observable rate limiting for axum and tower services. A [`Limiter`]
//! decides every limit of a request's tier and route together, atomically,
//! in one call to its store: in process ([`store::MemoryStore`], the
//! embedded default), one Redis node or a Redis Cluster (one EVALSHA of the
//! `lua/` scripts, on the Redis clock). When Redis is slow or gone a per-route
//! failure policy answers; every decision becomes a telemetry event that
//! feeds Prometheus metrics, a fleet-wide view and the built-in dashboard.
//!
//! ```no_run
//! use axum::{Router, routing::get};
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let limiter = ratewatch::Limiter::from_config_file("ratewatch.toml").await?;
//! let app: Router = Router::new()
//!     .route("/api/users", get(|| async { "users" }))
//!     .layer(limiter.layer())
//!     .nest("/dashboard", limiter.dashboard())
//!     .route("/metrics", get(limiter.metrics_handler()));
//! # Ok(()) }
//! ```
#![warn(missing_docs)]
#![forbid(unsafe_code)]

pub mod algorithm;
pub mod clock;
#[cfg(feature = "dashboard")]
pub mod dashboard;
mod error;
pub mod identity;
pub mod layer;
mod limiter;
pub mod policy;
pub mod resilience;
pub mod server;
pub mod store;
pub mod telemetry;

pub use error::Error;
pub use identity::{Identity, KeyExtractor, TierResolver};
pub use layer::{RateLimit, RateLimitLayer};
pub use limiter::{
    Decision, LimitReport, Limiter, LimiterBuilder, PolicySnapshot, PolicyStatus, PolicyVersion,
    ReloadAttempt, ReloadError, ReloadOutcome, RouteMatch, Source,
};
pub use policy::{Limit, Policy, RouteRule, Tier};
