//! The limiter's own answers: 429, 503, 400, 401, each with a small JSON
//! body saying what happened and when to retry.

use std::time::Duration;

use axum::Json;
use axum::response::{IntoResponse, Response};
use http::{HeaderValue, StatusCode, header};
use serde::Serialize;

use super::headers::{self, ceil_secs};
use crate::identity::IdentityError;
use crate::policy::FailurePolicy;
use crate::{Decision, Source};

#[derive(Serialize)]
struct Refusal<'a> {
    error: &'static str,
    message: String,
    tier: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    limit: Option<&'a str>,
    retry_after_seconds: u64,
}

/// The answer to a refused request: 429 when a limit blocked it, 503 when
/// the store could not decide and the route fails closed.
pub(crate) fn refused(d: &Decision, jitter: Duration) -> Response {
    let closed = matches!(
        d.source,
        Source::Fallback {
            policy: FailurePolicy::Closed,
            ..
        }
    );
    let retry = d.retry_after.unwrap_or(Duration::from_secs(1));
    let jitter = if jitter.is_zero() {
        Duration::ZERO
    } else {
        Duration::from_micros(rand::random_range(0..=jitter.as_micros() as u64))
    };
    let retry_secs = ceil_secs(retry + jitter).max(1);
    let limit = d.most_constraining().map(|l| &*l.name);
    let (status, body) = if closed {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            Refusal {
                error: "rate_limiter_unavailable",
                message: format!(
                    "the rate limiter cannot decide right now and this route fails closed; retry in {retry_secs} s"
                ),
                tier: &d.tier,
                limit: None,
                retry_after_seconds: retry_secs,
            },
        )
    } else {
        (
            StatusCode::TOO_MANY_REQUESTS,
            Refusal {
                error: "rate_limited",
                message: format!(
                    "limit \"{}\" of tier \"{}\" exceeded; retry in {retry_secs} s",
                    limit.unwrap_or("?"),
                    d.tier
                ),
                tier: &d.tier,
                limit,
                retry_after_seconds: retry_secs,
            },
        )
    };
    let mut res = (status, Json(body)).into_response();
    headers::insert(res.headers_mut(), d);
    res.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from(retry_secs));
    res
}

#[derive(Serialize)]
struct BadIdentity {
    error: &'static str,
    message: String,
}

/// The answer to a request whose identity is malformed (400) or missing
/// where keys are required (401).
pub(crate) fn identity_error(e: &IdentityError) -> Response {
    let status = e.status();
    let error = if status == StatusCode::UNAUTHORIZED {
        "api_key_required"
    } else {
        "bad_identity"
    };
    let mut res = (
        status,
        Json(BadIdentity {
            error,
            message: e.to_string(),
        }),
    )
        .into_response();
    if status == StatusCode::UNAUTHORIZED {
        res.headers_mut()
            .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    }
    res
}
