//! The rate-limiting service.

use std::task::{Context, Poll};

use axum::response::Response;
use http::Request;
use tower::Service;

use super::future::ResponseFuture;
use super::{headers, response};
use crate::Limiter;

/// Wraps a service: identifies the caller, decides, and either answers
/// (429 / 503 / 400 / 401) or passes the request on with headers added.
#[derive(Debug, Clone)]
pub struct RateLimit<S> {
    inner: S,
    limiter: Limiter,
}

impl<S> RateLimit<S> {
    /// Wraps `inner`.
    pub fn new(inner: S, limiter: Limiter) -> Self {
        Self { inner, limiter }
    }
}

impl<S, B> Service<Request<B>> for RateLimit<S>
where
    S: Service<Request<B>, Response = Response> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    B: Send + 'static,
{
    type Response = Response;
    type Error = S::Error;
    type Future = ResponseFuture<S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        // The service that was driven to readiness handles this request;
        // a fresh clone takes its place for the next one.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let limiter = self.limiter.clone();
        ResponseFuture::new(Box::pin(async move {
            // One policy for the whole request, whatever reloads meanwhile.
            let limiter = limiter.snapshot();
            let route = limiter.route_for(req.method().as_str(), req.uri().path());
            if limiter.is_exempt(route.as_ref()) {
                return inner.call(req).await;
            }
            let identity = match limiter.extractor().extract(req.headers(), req.extensions()) {
                Ok(id) => id,
                Err(e) => return Ok(response::identity_error(&e)),
            };
            let tier = limiter.resolve_tier(&identity).await;
            let decision = limiter.check(&identity, &tier, route.as_ref()).await;
            if !decision.allowed {
                let jitter = limiter.policy().resilience.retry_after_jitter;
                return Ok(response::refused(&decision, jitter));
            }
            if !decision.delay.is_zero() {
                tokio::time::sleep(decision.delay).await;
            }
            let mut res = inner.call(req).await?;
            headers::insert(res.headers_mut(), &decision);
            Ok(res)
        }))
    }
}
