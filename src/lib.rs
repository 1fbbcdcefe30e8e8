//! # ratewatch
//!
//! Observable rate limiting for axum and any tower HTTP service (tonic,
//! hyper, `tower::service_fn`). A [`Limiter`]
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
//!     .route("/api/ratelimit/status", get(limiter.status_handler()))
//!     .nest("/dashboard", limiter.dashboard())
//!     .route("/metrics", get(limiter.metrics_handler()));
//! # Ok(()) }
//! ```
//!
//! ## The public API
//!
//! - At the root: [`Limiter`] (built by [`LimiterBuilder`]) and what it
//!   answers ([`Decision`], [`LimitReport`], [`Source`], [`RouteMatch`]),
//!   settling after the response ([`Reservation`], [`Settled`], [`Meter`],
//!   [`Usage`]),
//!   the layer ([`RateLimitLayer`], [`RateLimit`]), the policy's main types
//!   ([`Policy`], [`Tier`], [`Limit`], [`RouteRule`]), the identity traits
//!   ([`KeyExtractor`], [`TierResolver`], [`Identity`]), [`BreakerState`]
//!   and [`Error`].
//! - [`policy`]: settings, the builder, TOML loading, environment
//!   overrides, [`policy::ConfigError`].
//! - [`layer`]: layer options ([`layer::Refusal`], [`layer::HeaderFamilies`],
//!   [`layer::PeerAddr`]), the bodies it answers in
//!   ([`layer::RefusalBody`]: axum, tonic, http-body-util, `String`), gRPC
//!   refusals, and the header names.
//! - [`identity`]: the default extractor and resolver, client-IP logic.
//! - [`algorithm`]: the pure algorithms, for custom stores and tests.
//! - [`store`]: the [`store::Store`] trait, the memory, Redis and cluster
//!   stores, and the key schema ([`store::keys`]).
//! - [`telemetry`]: events, outcomes, the fleet view's types, metric names.
//! - [`clock`]: the clock trait and a manual clock for tests.
//! - `server` (feature `server`): the `ratewatch` binary's router.
//!
//! [`resilience`]: the circuit breaker, a pure state machine. The
//! dashboard's internals and the Lua plumbing are private.
//! `tests/public_api.rs` keeps a snapshot of every public item, so a change
//! to this list is deliberate.
//!
//! ## Features
//!
//! None by default: the default build is the layer, the memory store,
//! the policy file and the Prometheus metrics.
//!
//! - `redis-store`: the Redis and Redis Cluster stores and the fleet
//!   view's Redis sink.
//! - `dashboard`: the built-in dashboard (askama templates).
//! - `tls`: `rediss://` for every Redis store kind (rustls, ring).
//! - `tonic`: tonic's body as one the layer answers in, for
//!   `tonic::transport::Server::builder().layer(limiter.layer())`.
//! - `server`: the binary's command line, logging and demo server, with
//!   `redis-store` and `dashboard`; an embedding app leaves it off.
//!
//! A tower service that is not an axum router, with no axum in sight:
//!
//! ```
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! use std::convert::Infallible;
//! use http::{Request, Response};
//! use tower::{ServiceBuilder, ServiceExt, service_fn};
//! # let limiter = ratewatch::Limiter::new(ratewatch::Policy::builder()
//! #     .tier(ratewatch::Tier::new("free").limit(ratewatch::Limit::per_minute("minute", 60)))
//! #     .tier(ratewatch::Tier::new("anonymous").limit(ratewatch::Limit::per_minute("minute", 60)))
//! #     .build().unwrap()).await.unwrap();
//! let svc = ServiceBuilder::new()
//!     .layer(limiter.layer())
//!     .service(service_fn(|_: Request<String>| async {
//!         Ok::<_, Infallible>(Response::new(String::from("hello")))
//!     }));
//! let req = Request::builder().header("x-api-key", "k").body(String::new()).unwrap();
//! let res = svc.oneshot(req).await.unwrap();
//! assert_eq!(res.headers()["x-ratelimit-remaining"], "59");
//! # });
//! ```
#![warn(missing_docs)]
#![forbid(unsafe_code)]

pub mod algorithm;
pub mod clock;
#[cfg(feature = "dashboard")]
mod dashboard;
mod error;
pub mod identity;
pub mod layer;
pub mod lease;
mod limiter;
pub mod policy;
pub mod resilience;
#[cfg(feature = "server")]
pub mod server;
#[cfg(feature = "rls")]
pub mod service;
mod status;
pub mod store;
pub mod telemetry;

pub use error::Error;
pub use identity::{Identity, KeyExtractor, TierResolver};
pub use layer::{RateLimit, RateLimitLayer};
pub use limiter::{
    Costs, Decision, DecisionPath, Follow, Group, GroupReport, Groups, GroupsDecision,
    GroupsFailure, GroupsUnavailable, LimitReport, Limiter, LimiterBuilder, Meter, PolicySnapshot,
    PolicyStatus, PolicyVersion, ReloadAttempt, ReloadError, ReloadOutcome, Reservation,
    RouteMatch, Settled, Slot, Source, UnitUsage, Usage, group_decision,
};
pub use policy::{Limit, Policy, RouteRule, Tier};
pub use resilience::BreakerState;

/// The README's code blocks, compiled and run as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
