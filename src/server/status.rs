//! `GET /api/ratelimit/status`: the caller's quota per limit, consuming
//! nothing.

use axum::Json;
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use crate::Limiter;
use crate::layer::headers;

#[derive(Serialize)]
struct Status {
    tier: String,
    identity: String,
    limits: Vec<LimitStatus>,
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

pub(super) async fn status(State(limiter): State<Limiter>, req: Request) -> Response {
    let identity = match limiter.extractor().extract(req.headers(), req.extensions()) {
        Ok(id) => id,
        Err(e) => return crate::layer::identity_error_response(&e),
    };
    let tier = limiter.resolve_tier(&identity).await;
    let d = limiter.peek(&identity, &tier, None).await;
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
    };
    let mut res = Json(body).into_response();
    headers::insert(res.headers_mut(), &d);
    res
}
