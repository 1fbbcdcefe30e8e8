//! The quota status endpoint ([`Limiter::status_handler`]): the caller's
//! quota per limit, consuming nothing.

use std::future::Future;
use std::pin::Pin;

use axum::Json;
use axum::extract::Request;
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use crate::Limiter;
use crate::algorithm::Algorithm;
use crate::layer::headers;
use crate::store::{Batch, Item, MemoryStore};

#[derive(Serialize)]
struct Status {
    tier: String,
    identity: String,
    limits: Vec<LimitStatus>,
    /// The version and content hash of the policy that answered.
    policy: crate::PolicyVersion,
}

#[derive(Serialize)]
struct LimitStatus {
    name: String,
    quota: u64,
    window_seconds: u64,
    /// `null` while the store cannot be asked.
    remaining: Option<u64>,
    reset_seconds: u64,
    shadow: bool,
}

/// Looking is free of quota but not of cost (a store round trip each), so
/// each caller may look a few times a second, decided in process.
#[derive(Clone)]
struct StatusGuard {
    store: MemoryStore,
}

impl StatusGuard {
    fn new() -> Self {
        Self {
            store: MemoryStore::new(),
        }
    }

    /// Per identity and per client address group (an IPv6 client's
    /// `ipv6_prefix` network, as IP-scoped limits count it), so inventing
    /// keys or addresses does not buy looks.
    fn admits(&self, identity: &crate::Identity, ipv6_prefix: u8) -> bool {
        let bucket = Algorithm::TokenBucket {
            capacity: 20,
            refill_per_second: 5.0,
        };
        let mut items = vec![Item::new(identity.hash(), bucket.clone())];
        if let Some(ip) = identity.ip {
            let group = crate::identity::address_group(ip, ipv6_prefix);
            items.push(Item::new(format!("ip:{group}"), bucket));
        }
        self.store.decide_now(&Batch::consume(&items, 1)).allowed
    }
}

/// The future of the status handler.
pub type StatusFuture = Pin<Box<dyn Future<Output = Response> + Send + 'static>>;

impl Limiter {
    /// An axum handler reporting the caller's quota per limit of its tier
    /// without consuming any: mount it in any router, whatever its state,
    /// with `.route("/api/ratelimit/status", get(limiter.status_handler()))`.
    /// The caller is identified as the layer identifies it; looking is
    /// itself limited to 5 per second per caller and per client IP, decided
    /// in process.
    ///
    /// ```
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// use axum::{Router, body::Body, routing::get};
    /// use http::Request;
    /// use tower::ServiceExt;
    /// use ratewatch::{Limit, Limiter, Policy, Tier};
    /// #[derive(Clone)]
    /// struct AppState;
    /// let policy = Policy::builder()
    ///     .tier(Tier::new("free").limit(Limit::per_minute("minute", 60)))
    ///     .tier(Tier::new("anonymous").limit(Limit::per_minute("minute", 60)))
    ///     .build()
    ///     .unwrap();
    /// let limiter = Limiter::new(policy).await.unwrap();
    /// let app: Router<AppState> =
    ///     Router::new().route("/api/ratelimit/status", get(limiter.status_handler()));
    /// let res = app
    ///     .with_state(AppState)
    ///     .oneshot(Request::get("/api/ratelimit/status").body(Body::empty()).unwrap())
    ///     .await
    ///     .unwrap();
    /// assert_eq!(res.status(), 200);
    /// # });
    /// ```
    pub fn status_handler(
        &self,
    ) -> impl Fn(Request) -> StatusFuture + Clone + Send + Sync + 'static {
        let limiter = self.clone();
        let guard = StatusGuard::new();
        move |req: Request| -> StatusFuture {
            Box::pin(status(limiter.clone(), guard.clone(), req))
        }
    }
}

async fn status(limiter: Limiter, guard: StatusGuard, req: Request) -> Response {
    // One policy answers the whole look, whatever reloads meanwhile.
    let limiter = limiter.snapshot();
    let (parts, _) = req.into_parts();
    // The layer's own rules: the same request gets the same caller here.
    let crate::identity::Caller { identity, tier } = match limiter.caller(&parts) {
        Ok(caller) => caller,
        Err(e) => return crate::layer::identity_error_response(&e),
    };
    if !guard.admits(&identity, limiter.policy().identity.ipv6_prefix) {
        let mut res = (
            http::StatusCode::TOO_MANY_REQUESTS,
            Json(serde_json::json!({
                "error": "rate_limited",
                "message": "status is limited to 5 looks per second per caller",
                "retry_after_seconds": 1,
            })),
        )
            .into_response();
        res.headers_mut().insert(
            http::header::RETRY_AFTER,
            http::HeaderValue::from_static("1"),
        );
        return res;
    }
    let d = limiter.peek(&identity, &tier, None).await;
    let policy = limiter.version().clone();
    let body = Status {
        tier: d.tier.to_string(),
        identity: identity.masked(),
        limits: d
            .limits
            .iter()
            .map(|l| LimitStatus {
                name: l.name.to_string(),
                quota: l.quota,
                window_seconds: l.window_secs,
                remaining: l.remaining.map(|r| r.max(0.0).floor() as u64),
                reset_seconds: headers::ceil_secs(l.reset_after),
                shadow: l.shadow,
            })
            .collect(),
        policy,
    };
    let mut res = Json(body).into_response();
    headers::insert(res.headers_mut(), &d);
    res
}
