//! The rate-limiting service.

use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use tower::Service;

use super::body::RefusalBody;
use super::future::{HeldSlot, ResponseFuture};
use super::headers;
use super::options::{Options, Refused};
use super::response::Refusal;
use super::response_body::ResponseBody;
use crate::Limiter;

/// The path route rules are matched against: the one the client sent, as
/// the outermost axum router saw it (`OriginalUri`), not the remainder a
/// layer inside `Router::nest("/v1", ...)` is shown, so `/v1/...` rules
/// apply there too. Outside axum (tonic, hyper, a plain tower service),
/// the request's own path: `/package.Service/Method` for gRPC.
fn routed_path<B>(req: &Request<B>) -> &str {
    req.extensions()
        .get::<axum::extract::OriginalUri>()
        .map_or_else(|| req.uri().path(), |o| o.0.path())
}

/// Wraps a service: identifies the caller, decides, and either answers
/// (429 / 503 / 400 / 401, or a gRPC status for a gRPC request) or passes
/// the request on with headers added.
///
/// It wraps any `tower::Service<http::Request<ReqBody>, Response =
/// http::Response<ResBody>>` whose response body is a
/// [`RefusalBody`](super::RefusalBody) (axum's, tonic's with feature
/// `tonic`, http-body-util's, `String`, ...), and keeps the service's
/// error type.
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

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for RateLimit<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ReqBody: Send + 'static,
    ResBody: RefusalBody,
{
    type Response = Response<ResponseBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        // The service that was driven to readiness handles this request;
        // a fresh clone takes its place for the next one.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let options = &self.options;
        // One policy for the whole request, whatever reloads meanwhile.
        let limiter = self.limiter.snapshot();
        let body_json = req
            .extensions()
            .get::<super::body_costs::BodyJson>()
            .map(|b| &*b.0);
        let route = limiter.route_for_request(
            req.method().as_str(),
            routed_path(&req),
            req.headers(),
            body_json,
        );
        if limiter.is_exempt(route.as_ref()) {
            return ResponseFuture::passed(inner.call(req));
        }
        let (mut parts, body) = req.into_parts();
        options.find_peer(&mut parts.extensions);
        let crate::identity::Caller { identity, tier } = match limiter.caller(&parts) {
            Ok(caller) => caller,
            Err(e) => {
                let refusal = Refusal::of_identity(&e);
                return refused(options.refuse(&refusal, &parts.headers));
            }
        };
        // A route rule's estimates meter the request like a cost function,
        // filling in the units the app's function did not name.
        let estimated = route.as_ref().and_then(|r| {
            let json = parts.extensions.get::<super::body_costs::BodyJson>();
            r.rule().estimate(&parts.headers, json.map(|j| &*j.0))
        });
        if options.cost.is_some() || estimated.is_some() {
            let mut cost = options.cost.as_ref().and_then(|cost| cost(&parts));
            if let Some(estimated) = estimated {
                let costs = cost.get_or_insert_with(crate::Costs::new);
                for (unit, n) in estimated.iter() {
                    if costs.get(unit).is_none() {
                        costs.set(unit.to_owned(), n);
                    }
                }
            }
            return metered(
                limiter,
                options.clone(),
                inner,
                parts,
                body,
                identity,
                tier,
                route,
                cost,
            );
        }
        // The memory store decides here, synchronously: the response future
        // is then the inner service's own. Any other store is waited for.
        let Some(decision) = limiter.check_now(&identity, &tier, route.as_ref()) else {
            let options = options.clone();
            return ResponseFuture::waiting(Box::pin(async move {
                let decision = limiter.check(&identity, &tier, route.as_ref()).await;
                match answer(&limiter, &options, decision, &identity, &parts) {
                    Answer::Refuse(refusal) => Ok(refusal.get().await),
                    Answer::Pass(mut decision) => {
                        let slot = decision.slot.take();
                        if !decision.delay.is_zero() {
                            tokio::time::sleep(decision.delay).await;
                        }
                        let req = pass_on(parts, body, &decision);
                        let mut res = inner.call(req).await?;
                        headers::insert_families(res.headers_mut(), &decision, options.headers);
                        res.extensions_mut().insert(decision);
                        if let Some(slot) = slot {
                            res.extensions_mut().insert(HeldSlot(slot));
                        }
                        Ok(res)
                    }
                }
            }));
        };
        let mut decision = match answer(&limiter, options, decision, &identity, &parts) {
            Answer::Refuse(refusal) => return refused(refusal),
            Answer::Pass(d) => d,
        };
        // The slot rides with the response body, not with the copies of
        // the decision in the extensions, so it goes back when the body
        // ends or anything on the way is dropped.
        let slot = decision.slot.take();
        if !decision.delay.is_zero() {
            // A leaky bucket shapes this request: hold it, then pass it on.
            let families = options.headers;
            return ResponseFuture::waiting(Box::pin(async move {
                tokio::time::sleep(decision.delay).await;
                let req = pass_on(parts, body, &decision);
                let mut res = inner.call(req).await?;
                headers::insert_families(res.headers_mut(), &decision, families);
                res.extensions_mut().insert(decision);
                if let Some(slot) = slot {
                    res.extensions_mut().insert(HeldSlot(slot));
                }
                Ok(res)
            }));
        }
        parts.extensions.insert(decision.clone());
        let req = Request::from_parts(parts, body);
        ResponseFuture::limited(inner.call(req), decision, slot, options.headers)
    }
}

/// A request decided at `cost` (`None`: the route rule's) with a
/// reservation: an admitted one carries a [`crate::Meter`] in its
/// extensions, and the response's [`crate::Usage`] is recorded in it when
/// the response head comes back. The layer's own clone of the meter drops
/// then; the request settles when the handler's clones are gone too.
#[allow(clippy::too_many_arguments)]
fn metered<S, ReqBody, ResBody>(
    limiter: crate::limiter::PolicySnapshot,
    options: Arc<Options>,
    mut inner: S,
    mut parts: http::request::Parts,
    body: ReqBody,
    identity: crate::Identity,
    tier: String,
    route: Option<crate::RouteMatch>,
    cost: Option<crate::Costs>,
) -> ResponseFuture<S::Future>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ReqBody: Send + 'static,
    ResBody: RefusalBody,
{
    ResponseFuture::waiting(Box::pin(async move {
        let (decision, reservation) = limiter
            .reserve_costs(&identity, &tier, route.as_ref(), cost.as_ref())
            .await;
        let decision = match answer(&limiter, &options, decision, &identity, &parts) {
            Answer::Refuse(refusal) => return Ok(refusal.get().await),
            Answer::Pass(decision) => decision,
        };
        // The slot rides with the response body, as on the unmetered path.
        let mut decision = decision;
        let slot = decision.slot.take();
        // Every request that passes gets a meter, so a handler taking
        // `Extension<Meter>` runs when the failure policy let it through
        // too; one without a reservation settles nothing.
        let meter = reservation.map_or_else(crate::Meter::detached, crate::Meter::new);
        parts.extensions.insert(meter.clone());
        if !decision.delay.is_zero() {
            tokio::time::sleep(decision.delay).await;
        }
        let req = pass_on(parts, body, &decision);
        let mut res = inner.call(req).await?;
        if let Some(crate::Usage(units)) = res.extensions().get() {
            meter.record(*units);
        }
        if let Some(crate::UnitUsage(used)) = res.extensions().get() {
            meter.record_costs(used);
        }
        // No settle trap: a request refused downstream used nothing.
        let refund = route.as_ref().is_none_or(|r| r.rule().refund_on_error);
        if refund && res.status().as_u16() >= 400 && !meter.is_recorded() {
            meter.refund_unless_recorded();
        }
        drop(meter);
        headers::insert_families(res.headers_mut(), &decision, options.headers);
        res.extensions_mut().insert(decision);
        if let Some(slot) = slot {
            res.extensions_mut().insert(HeldSlot(slot));
        }
        Ok(res)
    }))
}

/// The future of a refusal: ready, or boxed while an app's answer is read.
fn refused<F, B, E>(refusal: Refused<B>) -> ResponseFuture<F>
where
    F: Future<Output = Result<Response<B>, E>>,
    B: Send + 'static,
{
    match refusal {
        Refused::Now(res) => ResponseFuture::ready(res),
        Refused::Later(fut) => ResponseFuture::waiting(Box::pin(async move { Ok(fut.await) })),
    }
}

/// What the layer does with a decision.
enum Answer<B> {
    /// Pass the request on, with its decision.
    Pass(crate::Decision),
    /// Refuse it with this response (the decision in its extensions).
    Refuse(Refused<B>),
}

/// Names the request's method in the decision, calls the decision hook,
/// then refuses a request the decision blocks.
fn answer<B: RefusalBody>(
    limiter: &crate::limiter::PolicySnapshot,
    options: &Options,
    mut decision: crate::Decision,
    identity: &crate::Identity,
    parts: &http::request::Parts,
) -> Answer<B> {
    decision.method = Some(parts.method.clone());
    if let Some(hook) = &options.on_decision {
        hook(&decision, identity);
    }
    if decision.allowed {
        return Answer::Pass(decision);
    }
    let jitter = limiter.policy().resilience.retry_after_jitter;
    Answer::Refuse(options.refuse(&Refusal::of_decision(&decision, jitter), &parts.headers))
}

/// The request, with its decision for the handler (`Extension<Decision>`).
fn pass_on<B>(mut parts: http::request::Parts, body: B, decision: &crate::Decision) -> Request<B> {
    parts.extensions.insert(decision.clone());
    Request::from_parts(parts, body)
}
