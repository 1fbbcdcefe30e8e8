//! The decision service: ratewatch for an Envoy (or Istio) gateway and for
//! services in any language, beside the middleware of [`crate::layer`].
//!
//! - [`grpc`]: Envoy's rate limit service v3
//!   (`envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`) and
//!   `grpc.health.v1.Health`, over h2c, wire-compatible with Envoy 1.40
//!   (`ratewatch serve --grpc-listen ADDR`).
//! - [`http`]: `POST /json` (the same request and answer as proto3 JSON,
//!   as envoyproxy/ratelimit serves it) and the native `POST /v1/decide`,
//!   with `GET /rlconfig`, the loaded descriptor configuration as text.
//!
//! Every front end converts its wire format to an [`RlsRequest`], asks
//! [`RateLimitService`], and converts the [`RlsAnswer`] back. The service
//! matches descriptors to the policy's `[rls]` domains and decides every
//! descriptor of a request in one atomic store call through
//! [`Limiter::decide_groups`](crate::Limiter::decide_groups); it never
//! touches a store itself.
//!
//! ```
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! use ratewatch::service::{RateLimitService, RlsDescriptor, RlsRequest};
//! use ratewatch::{Limiter, Policy};
//! let policy = Policy::from_toml_str(
//!     r#"
//! [[rls.domains]]
//! name = "edge"
//!
//! [[rls.domains.rules]]
//! descriptor = ["remote_address"]
//! limits = [{ name = "minute", algorithm = "fixed_window", limit = 1, window = "60s" }]
//! "#,
//!     None,
//! )
//! .unwrap();
//! let service = RateLimitService::new(Limiter::new(policy).await.unwrap());
//! let request = RlsRequest {
//!     domain: "edge".into(),
//!     descriptors: vec![RlsDescriptor {
//!         entries: vec![("remote_address".into(), "10.0.0.1".into())],
//!         ..Default::default()
//!     }],
//!     hits_addend: 0,
//! };
//! let first = service.decide(&request, "grpc").await.unwrap();
//! assert!(!first.over_limit);
//! assert_eq!(first.statuses[0].limit_remaining, 0);
//! let second = service.decide(&request, "grpc").await.unwrap();
//! assert!(second.over_limit && second.statuses[0].over_limit);
//! # });
//! ```

mod convert;
mod decide;
pub mod grpc;
pub mod http;
mod json;
pub mod proto;
mod request;
mod reservations;
mod rlconfig;
mod settle;

pub use convert::{request_from_wire, response_to_wire};
pub use decide::{RateLimitService, RlsError};
pub use grpc::{HealthServer, RateLimitServer, serve};
pub use json::{JsonError, request_from_json, response_to_json};
pub use request::{CurrentLimit, LimitOverride, RlsAnswer, RlsDescriptor, RlsRequest, RlsStatus};
