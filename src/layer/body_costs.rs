//! [`BodyCostsLayer`]: reads the cost estimates a route rule takes from the
//! request's JSON body (`costs = [{ unit = "tokens", json = "max_tokens" }]`)
//! before [`RateLimitLayer`](super::RateLimitLayer) decides.
//!
//! Only requests whose matched rule has a JSON estimate are read, through a
//! buffer bounded by the rule's `max_body_bytes` (1 MiB by default): a body
//! longer than that (by its `Content-Length`, or as it arrives) is refused
//! with 413 and never read further. The body is handed on intact to the
//! handler. A body that is not JSON, or lacks the field, names no cost:
//! the unit is then checked without charge. Put it outside the rate limit
//! layer, so it runs first:
//!
//! ```
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! use axum::{Router, routing::post, body::Body};
//! use http::Request;
//! use tower::ServiceExt;
//! use ratewatch::{Limit, Limiter, Policy, RouteRule, Tier};
//! use ratewatch::policy::CostEstimate;
//! let policy = Policy::builder()
//!     .tier(Tier::new("free").limit(Limit::per_minute("tpm", 1000).unit("tokens")))
//!     .tier(Tier::new("anonymous").limit(Limit::per_minute("rpm", 5)))
//!     .route(RouteRule::new("POST", "/v1/chat").with_estimate(CostEstimate::json("tokens", "max_tokens")))
//!     .build()
//!     .unwrap();
//! let limiter = Limiter::new(policy).await.unwrap();
//! let app = Router::new()
//!     .route("/v1/chat", post(|body: String| async move { body }))
//!     .layer(limiter.layer())
//!     .layer(limiter.body_costs_layer());
//! let req = || Request::post("/v1/chat").header("x-api-key", "k")
//!     .body(Body::from(r#"{"max_tokens": 600}"#)).unwrap();
//! let res = app.clone().oneshot(req()).await.unwrap();
//! assert_eq!(res.headers()["x-ratelimit-remaining-tokens"], "400");
//! assert_eq!(app.oneshot(req()).await.unwrap().status(), 429);
//! # });
//! ```

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use axum::body::Body;
use bytes::Bytes;
use http::{Request, Response, StatusCode, header};
use tower::{Layer, Service};

use super::body::RefusalBody;
use std::sync::Arc;

use crate::Limiter;

/// A request's JSON body as read (`Null` when it was not JSON), for the
/// rate limit layer's route conditions and estimates.
#[derive(Debug, Clone)]
pub(crate) struct BodyJson(pub(crate) Arc<serde_json::Value>);

/// Reads the JSON body of requests whose route rules need it (a `json`
/// cost estimate or `when` condition), through a buffer bounded by the
/// route's `max_body_bytes` (413 beyond), and hands the body on intact.
/// Made by [`Limiter::body_costs_layer`]; install it outside
/// [`Limiter::layer`].
#[derive(Debug, Clone)]
pub struct BodyCostsLayer {
    limiter: Limiter,
}

impl Limiter {
    /// The layer that reads route rules' JSON-body estimates
    /// ([`BodyCostsLayer`]); add it outside [`Limiter::layer`].
    pub fn body_costs_layer(&self) -> BodyCostsLayer {
        BodyCostsLayer {
            limiter: self.clone(),
        }
    }
}

impl<S> Layer<S> for BodyCostsLayer {
    type Service = BodyCostsService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        BodyCostsService {
            inner,
            limiter: self.limiter.clone(),
        }
    }
}

/// The service of [`BodyCostsLayer`].
#[derive(Debug, Clone)]
pub struct BodyCostsService<S> {
    inner: S,
    limiter: Limiter,
}

type Boxed<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

impl<S, ResBody> Service<Request<Body>> for BodyCostsService<S>
where
    S: Service<Request<Body>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ResBody: RefusalBody,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future = Boxed<Result<Response<ResBody>, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let path = req
            .extensions()
            .get::<axum::extract::OriginalUri>()
            .map_or_else(|| req.uri().path(), |o| o.0.path());
        let method = req.method().as_str();
        // The bound of the first rule for the request that reads bodies.
        let policy = self.limiter.policy();
        let Some(max) = policy
            .routes
            .iter()
            .find(|r| !r.exempt && r.reads_body() && r.matches(method, path))
            .map(|r| r.max_body_bytes)
        else {
            return Box::pin(inner.call(req));
        };
        Box::pin(async move {
            let bound = usize::try_from(max).unwrap_or(usize::MAX);
            let (mut parts, body) = req.into_parts();
            let declared = parts
                .headers
                .get(header::CONTENT_LENGTH)
                .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
            if declared.is_some_and(|n| n > max) {
                return Ok(too_large(max));
            }
            let bytes: Bytes = match axum::body::to_bytes(body, bound).await {
                Ok(b) => b,
                // Over the bound as it arrived, or the client went away:
                // either way nothing more is read.
                Err(_) => return Ok(too_large(max)),
            };
            let json = serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null);
            parts.extensions.insert(BodyJson(Arc::new(json)));
            inner
                .call(Request::from_parts(parts, Body::from(bytes)))
                .await
        })
    }
}

/// The 413 of a body longer than `bound` bytes.
fn too_large<B: RefusalBody>(bound: u64) -> Response<B> {
    let body = serde_json::json!({
        "error": "body_too_large",
        "message": format!("the request body is longer than the {bound} bytes this route reads to estimate its cost"),
    });
    let mut res = Response::new(B::from_bytes(Bytes::from(body.to_string())));
    *res.status_mut() = StatusCode::PAYLOAD_TOO_LARGE;
    res.headers_mut().insert(
        header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    res
}
