//! The tower middleware: [`RateLimitLayer`] builds [`RateLimit<S>`], whose
//! future is [`ResponseFuture`].
//!
//! It decides in `call` (never in `poll_ready`), answers every outcome
//! with a response (429, 503, 400, 401: never a dropped connection), and
//! puts the rate-limit headers on every limited response. It works with
//! `Router::layer` and `Router::route_layer`.
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

mod future;
pub mod headers;
mod response;
mod service;

pub use future::ResponseFuture;
pub use service::RateLimit;

/// The 400 / 401 answer for a request without a usable identity.
pub fn identity_error_response(e: &crate::identity::IdentityError) -> axum::response::Response {
    response::identity_error(e)
}

use tower::Layer;

use crate::Limiter;

/// Rate-limits every request of the wrapped service with a [`Limiter`].
#[derive(Debug, Clone)]
pub struct RateLimitLayer {
    limiter: Limiter,
}

impl RateLimitLayer {
    /// A layer deciding with `limiter`.
    pub fn new(limiter: Limiter) -> Self {
        Self { limiter }
    }
}

impl<S> Layer<S> for RateLimitLayer {
    type Service = RateLimit<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimit::new(inner, self.limiter.clone())
    }
}

impl Limiter {
    /// The tower layer of this limiter.
    pub fn layer(&self) -> RateLimitLayer {
        RateLimitLayer::new(self.clone())
    }
}
