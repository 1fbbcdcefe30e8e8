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
mod options;
mod response;
mod service;

use std::sync::Arc;

use axum::response::Response;
use tower::Layer;

pub use future::ResponseFuture;
pub use headers::HeaderFamilies;
pub use response::Refusal;
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
    /// is there for billing; never log it.
    pub fn on_decision(
        mut self,
        hook: impl Fn(&Decision, &Identity) + Send + Sync + 'static,
    ) -> Self {
        Arc::make_mut(&mut self.options).on_decision = Some(Arc::new(hook));
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
