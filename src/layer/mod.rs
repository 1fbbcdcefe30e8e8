//! The tower middleware: [`RateLimitLayer`] builds [`RateLimit<S>`], whose
//! future is [`ResponseFuture`].
//!
//! It decides in `call` (never in `poll_ready`), answers every outcome
//! with a response (429, 503, 400, 401: never a dropped connection), and
//! puts the rate-limit headers on every limited response. It works with
//! `Router::layer` and `Router::route_layer`.
//!
//! It wraps any tower HTTP service, not only axum's: a tonic server, a
//! hyper or tower-http stack, a `tower::service_fn` answering
//! `http::Response<String>`. Its own answers are built in the wrapped
//! service's response body type, which must be a [`RefusalBody`]; a gRPC
//! request (`content-type: application/grpc`) is refused with a gRPC
//! status (`RESOURCE_EXHAUSTED` for a limit) instead of an HTTP 429
//! ([`grpc`](self#grpc)). The peer address comes from axum's
//! `ConnectInfo`, a plain `SocketAddr` in the extensions, or a
//! [`PeerAddr`] ([`peer`](self#peer)).
//!
//! ```
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! use axum::{Router, routing::get, body::Body};
//! use http::Request;
//! use tower::ServiceExt;
//! use ratewatch::{Limiter, Limit, Policy, Tier};
//! let policy = Policy::builder()
//!     .tier(Tier::new("free").limit(Limit::token_bucket("burst", 1, 0.1)))
//!     .tier(Tier::new("anonymous").limit(Limit::token_bucket("burst", 1, 0.1)))
//!     .build()
//!     .unwrap();
//! let limiter = Limiter::new(policy).await.unwrap();
//! let app = Router::new().route("/", get(|| async { "hi" })).layer(limiter.layer());
//! let req = || Request::get("/").header("x-api-key", "k1").body(Body::empty()).unwrap();
//! assert_eq!(app.clone().oneshot(req()).await.unwrap().status(), 200);
//! assert_eq!(app.oneshot(req()).await.unwrap().status(), 429);
//! # });
//! ```
//!
//! A plain tower service, with no axum router:
//!
//! ```
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! use std::convert::Infallible;
//! use http::{Request, Response};
//! use tower::{ServiceBuilder, ServiceExt, service_fn};
//! use ratewatch::{Limiter, Limit, Policy, Tier};
//! let policy = Policy::builder()
//!     .tier(Tier::new("free").limit(Limit::token_bucket("burst", 5, 0.1)))
//!     .tier(Tier::new("anonymous").limit(Limit::token_bucket("burst", 1, 0.1)))
//!     .build()
//!     .unwrap();
//! let limiter = Limiter::new(policy).await.unwrap();
//! let svc = ServiceBuilder::new().layer(limiter.layer()).service(service_fn(
//!     |_req: Request<String>| async { Ok::<_, Infallible>(Response::new(String::from("hi"))) },
//! ));
//! let req = || {
//!     let mut req = Request::new(String::new());
//!     // A server that knows the peer leaves a plain `SocketAddr`.
//!     req.extensions_mut().insert("192.0.2.1:4000".parse::<std::net::SocketAddr>().unwrap());
//!     req
//! };
//! // The layer's body is a `ResponseBody` around the service's own.
//! assert_eq!(svc.clone().oneshot(req()).await.unwrap().body().get_ref(), "hi");
//! let refused = svc.oneshot(req()).await.unwrap();
//! assert_eq!(refused.status(), 429);
//! assert!(refused.body().get_ref().contains("rate_limited"));
//! # });
//! ```
//!
//! # gRPC
//!
//! A gRPC client cannot read an HTTP 429, so a refused gRPC request gets
//! HTTP 200 with `grpc-status` 8 (`RESOURCE_EXHAUSTED`; 14 `UNAVAILABLE`
//! where the route fails closed, 3 `INVALID_ARGUMENT` for a malformed
//! identity, 16 `UNAUTHENTICATED` for a missing key) and a `grpc-message`,
//! with the rate-limit headers and `Retry-After` as response metadata.
//! With feature `tonic`, tonic's body is a [`RefusalBody`], so the layer
//! goes into `tonic::transport::Server::builder().layer(..)`; the app's
//! own [`RateLimitLayer::with_refusal`] answers HTTP requests only.
//!
//! # Peer
//!
//! See [`PeerAddr`]: axum's `ConnectInfo`, a plain `SocketAddr`, or a
//! lookup of the app's own.

mod body;
mod body_costs;
mod future;
mod grpc;
pub mod headers;
mod options;
mod peer;
mod response;
mod response_body;
mod service;

use std::sync::Arc;

use axum::response::Response;
use tower::Layer;

pub use body::RefusalBody;
pub use body_costs::{BodyCostsLayer, BodyCostsService};
pub use future::ResponseFuture;
pub use headers::HeaderFamilies;
pub use peer::{FORWARDING_HEADERS, NotLocal, PeerAddr, local_caller};
pub use response::Refusal;
pub use response_body::ResponseBody;
pub use service::RateLimit;

use crate::{Decision, Identity, Limiter};
use options::Options;

/// The 400 / 401 answer for a request without a usable identity.
pub fn identity_error_response(e: &crate::identity::IdentityError) -> Response {
    response::identity_error(e)
}

/// Rate-limits every request of the wrapped service with a [`Limiter`].
///
/// Handlers find the [`Decision`] in the request's extensions
/// (`Extension<Decision>`), and outer layers in the response's.
#[derive(Debug, Clone)]
pub struct RateLimitLayer {
    limiter: Limiter,
    options: Arc<Options>,
}

impl RateLimitLayer {
    /// A layer deciding with `limiter`.
    pub fn new(limiter: Limiter) -> Self {
        Self {
            limiter,
            options: Arc::default(),
        }
    }

    /// Answers refusals (429, 503, 400, 401) with `respond` instead of
    /// ratewatch's JSON body. [`Refusal::default_response`] is there to fall
    /// back on. The rate-limit headers, `Retry-After` and
    /// `WWW-Authenticate` are added where the response does not set them.
    /// The answer is built as an axum response and converted to the
    /// wrapped service's body ([`RefusalBody::from_axum_body`]). gRPC
    /// requests are always answered with a gRPC status
    /// ([`Refusal::grpc_response`]): a gRPC client reads nothing else.
    ///
    /// ```
    /// use axum::response::IntoResponse;
    /// use ratewatch::layer::{RateLimitLayer, Refusal};
    /// fn problem(r: &Refusal<'_>) -> axum::response::Response {
    ///     match r {
    ///         Refusal::RateLimited { retry_after_secs, .. } => (
    ///             r.status(),
    ///             [("content-type", "application/problem+json")],
    ///             format!(r#"{{"title":"Too Many Requests","retry_after":{retry_after_secs}}}"#),
    ///         )
    ///             .into_response(),
    ///         _ => r.default_response(),
    ///     }
    /// }
    /// # fn layer(limiter: ratewatch::Limiter) -> RateLimitLayer {
    /// limiter.layer().with_refusal(problem)
    /// # }
    /// ```
    pub fn with_refusal(
        mut self,
        respond: impl Fn(&Refusal<'_>) -> Response + Send + Sync + 'static,
    ) -> Self {
        Arc::make_mut(&mut self.options).responder = Some(Arc::new(respond));
        self
    }

    /// Calls `hook` with every decision the layer makes (allowed or not) and
    /// the caller it was made for, before the request goes on. Keep it cheap
    /// and non-blocking: it runs on the request path. The identity's raw key
    /// is there for billing; never log it. The decision names the matched
    /// route rule ([`Decision::route`]) and the request's method
    /// ([`Decision::method`]), and a fallback says so
    /// ([`Decision::is_fallback`], [`Decision::source`]) with no remaining
    /// quota made up.
    pub fn on_decision(
        mut self,
        hook: impl Fn(&Decision, &Identity) + Send + Sync + 'static,
    ) -> Self {
        Arc::make_mut(&mut self.options).on_decision = Some(Arc::new(hook));
        self
    }

    /// Finds the peer address of requests with `peer` where neither axum's
    /// `ConnectInfo` nor a plain `SocketAddr` is in the extensions: for
    /// tonic, `|e: &http::Extensions|
    /// e.get::<TcpConnectInfo>().and_then(|c| c.remote_addr())`.
    pub fn with_peer_addr(mut self, peer: impl PeerAddr) -> Self {
        Arc::make_mut(&mut self.options).peer = Some(Arc::new(peer));
        self
    }

    /// Decides each request at the cost `cost` finds in its parts (a
    /// header, the `Content-Length`, a claim an auth layer put into the
    /// extensions), `None` meaning the route rule's cost, and settles it
    /// after the response: the layer puts a [`Meter`](crate::Meter) into
    /// the extensions of every request it lets through (one the failure
    /// policy let through reserved nothing, and its meter settles
    /// nothing), and settles the difference between what was recorded there (or put in
    /// the response's extensions as a [`Usage`](crate::Usage)) and the
    /// cost reserved ([`crate::Reservation::settle`]). Nothing recorded,
    /// nothing settled: the reserved cost stands.
    ///
    /// `cost` must not panic: for a value it cannot parse it should answer
    /// `None` (the route rule's cost, as the example does), so a bad header
    /// is charged like a request without one. A cost above what a limit can
    /// ever admit is refused with a 429 without `Retry-After`
    /// ([`crate::Limiter::check_cost`]). `with_cost(|_| None)` meters at
    /// the route rules' costs.
    ///
    /// ```
    /// # fn layer(limiter: ratewatch::Limiter) -> ratewatch::RateLimitLayer {
    /// limiter.layer().with_cost(|parts: &http::request::Parts| {
    ///     parts.headers.get("x-estimated-tokens")?.to_str().ok()?.parse().ok()
    /// })
    /// # }
    /// ```
    pub fn with_cost(
        self,
        cost: impl Fn(&http::request::Parts) -> Option<u64> + Send + Sync + 'static,
    ) -> Self {
        self.with_costs(move |parts| cost(parts).map(crate::Costs::requests))
    }

    /// [`RateLimitLayer::with_cost`] with a cost per unit
    /// ([`Costs`](crate::Costs)): each limit is charged the request's cost
    /// in its unit, all in one decision, and a limit of a unit the costs do
    /// not name is checked without charge (refused once nothing of it is
    /// left). `None` is the route rule's cost in requests. The settle after
    /// the response is per unit ([`crate::Meter::record_unit`]).
    ///
    /// ```
    /// use ratewatch::Costs;
    /// # fn layer(limiter: ratewatch::Limiter) -> ratewatch::RateLimitLayer {
    /// limiter.layer().with_costs(|parts: &http::request::Parts| {
    ///     let tokens = parts.headers.get("x-max-tokens")?.to_str().ok()?.parse().ok()?;
    ///     Some(Costs::new().with("tokens", tokens))
    /// })
    /// # }
    /// ```
    pub fn with_costs(
        mut self,
        costs: impl Fn(&http::request::Parts) -> Option<crate::Costs> + Send + Sync + 'static,
    ) -> Self {
        Arc::make_mut(&mut self.options).cost = Some(Arc::new(costs));
        self
    }

    /// Sends only the header families in `families`.
    pub fn with_headers(mut self, families: HeaderFamilies) -> Self {
        Arc::make_mut(&mut self.options).headers = families;
        self
    }
}

impl<S> Layer<S> for RateLimitLayer {
    type Service = RateLimit<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimit::with_options(inner, self.limiter.clone(), self.options.clone())
    }
}

impl Limiter {
    /// The tower layer of this limiter.
    pub fn layer(&self) -> RateLimitLayer {
        RateLimitLayer::new(self.clone())
    }
}
