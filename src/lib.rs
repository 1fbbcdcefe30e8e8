//! # ratewatch
//!
//! Observable rate limiting for Rust web services and everything in front
//! of them. A [`Limiter`] decides every limit of a request's tier and route
//! together, atomically, in one call to its store: in process
//! ([`store::MemoryStore`], the embedded default), or one shared count in
//! Redis, a Redis Cluster or a Sentinel deployment (one EVALSHA of the
//! `lua/` scripts, on the Redis clock). When Redis is slow or gone a
//! per-route failure policy answers; every decision becomes a telemetry
//! event that feeds Prometheus metrics, a fleet-wide view and the built-in
//! dashboard.
//!
//! There are three ways in; the guide (`docs/` in the repository) has a
//! chapter for each.
//!
//! ## 1. Embed the middleware in axum or tonic
//!
//! [`Limiter::layer`] is a tower layer for an axum router, a tonic server
//! (feature `tonic`) or any tower HTTP service; it answers 429 (gRPC
//! `RESOURCE_EXHAUSTED`) with the standard rate-limit headers.
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
//! ## 2. Ask the decision service from Envoy or any language
//!
//! `ratewatch serve --grpc-listen ADDR` (feature `server`) answers Envoy's
//! rate limit service protocol and reads envoyproxy/ratelimit's YAML;
//! `POST /v1/decide` answers any language over HTTP. In Rust the same
//! service is `service::RateLimitService` (feature `rls`), and
//! [`Limiter::decide_groups`] decides several groups of limits (an RLS
//! request's descriptors) in one atomic store call.
//!
//! ## 3. Watch it: the dashboard, Grafana boards and alerts
//!
//! [`Limiter::metrics_handler`] serves Prometheus metrics with bounded
//! labels (see [`telemetry::metrics`]), `Limiter::dashboard` (feature
//! `dashboard`) the built-in page, which shows the whole fleet from Redis;
//! `dashboards/` in the repository ships Grafana boards and alert rules
//! matching those metrics, each alert with a runbook. Every decision is
//! also one `tracing` span, `ratewatch.decision`.
//!
//! Requests can cost what they use and be settled after the response
//! ([`Limiter::reserve`], [`Meter`], [`Usage`]), and in-flight limits hold
//! a [`Slot`] while a request runs.
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
//! - `rls`: the decision service, `service` (Envoy's rate limit service
//!   over gRPC, `POST /json`, `POST /v1/decide`).
//! - `server`: the binary's command line, logging and demo server, with
//!   `redis-store`, `dashboard` and `rls`; an embedding app leaves it off.
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
mod decimal;
mod error;
pub mod identity;
pub mod layer;
pub mod lease;
mod limiter;
pub mod policy;
#[cfg(feature = "redis-store")]
mod redis_client;
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

/// The README's and the guide's code blocks, compiled and run as doc
/// tests (`tests/docs.rs` checks that every page with a Rust block is
/// here).
#[cfg(doctest)]
mod guide {
    #[doc = include_str!("../README.md")]
    struct Readme;
    #[doc = include_str!("../docs/embedding.md")]
    struct Embedding;
    #[doc = include_str!("../docs/identity.md")]
    struct Identity;
    #[doc = include_str!("../docs/units.md")]
    struct Units;
    #[doc = include_str!("../docs/decision-service.md")]
    struct DecisionService;
    #[doc = include_str!("../docs/reloads.md")]
    struct Reloads;
    #[doc = include_str!("../docs/configuration.md")]
    struct Configuration;
    #[doc = include_str!("../docs/headers.md")]
    struct Headers;
    #[doc = include_str!("../docs/stores.md")]
    struct Stores;
    #[doc = include_str!("../docs/leases.md")]
    struct Leases;
    #[doc = include_str!("../docs/observability.md")]
    struct Observability;
    #[doc = include_str!("../docs/security.md")]
    struct Security;
    #[doc = include_str!("../docs/server.md")]
    struct Server;
    #[doc = include_str!("../docs/migrating-from-envoy-ratelimit.md")]
    struct Migrating;
    #[doc = include_str!("../docs/performance.md")]
    struct Performance;
    #[doc = include_str!("../docs/operations.md")]
    struct Operations;
    #[doc = include_str!("../docs/redis-memory.md")]
    struct RedisMemory;
    #[doc = include_str!("../docs/layout.md")]
    struct Layout;
    #[doc = include_str!("../docs/index.md")]
    struct Index;
    #[doc = include_str!("../CHANGELOG.md")]
    struct Changelog;
}
