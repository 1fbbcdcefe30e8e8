//! `GET /api/ratelimit/status`: the caller's quota per limit, consuming
//! nothing.

use axum::Extension;
use axum::Json;
use axum::extract::{Request, State};
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
pub(super) struct StatusGuard {
    store: MemoryStore,
}

impl StatusGuard {
    pub(super) fn new() -> Self {
        Self {
            store: MemoryStore::new(),
        }
    }

    /// Per identity and per client IP, so inventing keys does not buy looks.
    fn admits(&self, identity: &crate::Identity) -> bool {
        let bucket = Algorithm::TokenBucket {
            capacity: 20,
            refill_per_second: 5.0,
        };
        let mut items = vec![Item::new(identity.hash(), bucket.clone())];
        if let Some(ip) = identity.ip {
            items.push(Item::new(format!("ip:{ip}"), bucket));
        }
        self.store.decide_now(&Batch::consume(&items, 1)).allowed
    }
}

pub(super) async fn status(
    State(limiter): State<Limiter>,
    Extension(guard): Extension<StatusGuard>,
    req: Request,
) -> Response {
    // One policy answers the whole look, whatever reloads meanwhile.
    let limiter = limiter.snapshot();
    let identity = match limiter.extractor().extract(req.headers(), req.extensions()) {
        Ok(id) => id,
        Err(e) => return crate::layer::identity_error_response(&e),
    };
    if !guard.admits(&identity) {
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
    let tier = limiter.resolve_tier(&identity).await;
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
                remaining: d.state_known().then(|| l.remaining.max(0.0).floor() as u64),
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
