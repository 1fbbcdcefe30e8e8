//! The rate-limiting service.

use std::task::{Context, Poll};

use axum::response::Response;
use http::Request;
use tower::Service;

use std::sync::Arc;

use super::future::ResponseFuture;
use super::headers;
use super::options::Options;
use super::response::Refusal;
use crate::Limiter;

/// The path route rules are matched against: the one the client sent, as
/// the outermost axum router saw it (`OriginalUri`), not the remainder a
/// layer inside `Router::nest("/v1", ...)` is shown, so `/v1/...` rules
/// apply there too. Outside axum, the request's own path.
fn routed_path<B>(req: &Request<B>) -> &str {
    req.extensions()
        .get::<axum::extract::OriginalUri>()
        .map_or_else(|| req.uri().path(), |o| o.0.path())
}

/// Wraps a service: identifies the caller, decides, and either answers
/// (429 / 503 / 400 / 401) or passes the request on with headers added.
#[derive(Debug, Clone)]
pub struct RateLimit<S> {
    inner: S,
    limiter: Limiter,
    options: Arc<Options>,
}

impl<S> RateLimit<S> {
    /// Wraps `inner` with the default options.
    pub fn new(inner: S, limiter: Limiter) -> Self {
        Self::with_options(inner, limiter, Arc::default())
    }

    pub(super) fn with_options(inner: S, limiter: Limiter, options: Arc<Options>) -> Self {
        Self {
            inner,
            limiter,
            options,
        }
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
        let options = self.options.clone();
        ResponseFuture::new(Box::pin(async move {
            // One policy for the whole request, whatever reloads meanwhile.
            let limiter = limiter.snapshot();
            let route = limiter.route_for(req.method().as_str(), routed_path(&req));
            if limiter.is_exempt(route.as_ref()) {
                return inner.call(req).await;
            }
            let (mut parts, body) = req.into_parts();
            let identity = match limiter.identify(&parts) {
                Ok(id) => id,
                Err(e) => return Ok(options.refuse(&Refusal::of_identity(&e))),
            };
            let tier = limiter.resolve_tier(&identity, &parts);
            let decision = limiter.check(&identity, &tier, route.as_ref()).await;
            if let Some(hook) = &options.on_decision {
                hook(&decision, &identity);
            }
            if !decision.allowed {
                let jitter = limiter.policy().resilience.retry_after_jitter;
                let mut res = options.refuse(&Refusal::of_decision(&decision, jitter));
                res.extensions_mut().insert(decision);
                return Ok(res);
            }
            if !decision.delay.is_zero() {
                tokio::time::sleep(decision.delay).await;
            }
            parts.extensions.insert(decision.clone());
            let mut res = inner.call(Request::from_parts(parts, body)).await?;
            headers::insert_families(res.headers_mut(), &decision, options.headers);
            res.extensions_mut().insert(decision);
            Ok(res)
        }))
    }
}
