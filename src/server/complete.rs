//! `POST /api/complete`: a pretend model completion, to show token limits
//! at work. Its JSON body is `{"max_tokens": N, "used_tokens": M,
//! "stream": bool, "ms": T}`: the route rule reserves `max_tokens` tokens
//! before the handler runs (read by the body-costs layer), the handler
//! records `used_tokens` (`max_tokens` when absent) and the request is
//! settled at that; with `stream` the body goes out at once and ends `ms`
//! milliseconds later (at most 10,000), the request holding its in-flight
//! slot until then. Anything malformed is a 400, never a panic.

use std::time::Duration;

use axum::Extension;
use axum::body::Bytes;
use axum::response::{IntoResponse, Response};
use http::{StatusCode, header};
use serde::Deserialize;

use super::MAX_SLOW_MS;
use crate::Meter;

/// The body of a completion.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Completion {
    max_tokens: u64,
    used_tokens: Option<u64>,
    #[serde(default)]
    stream: bool,
    #[serde(default)]
    ms: u64,
}

pub(super) async fn complete(meter: Option<Extension<Meter>>, body: Bytes) -> Response {
    let c: Completion = match serde_json::from_slice(&body) {
        Ok(c) => c,
        Err(e) => return bad_request(e.to_string()),
    };
    if c.ms > MAX_SLOW_MS {
        return bad_request(format!("`ms` must be 0 to {MAX_SLOW_MS}"));
    }
    let used = c.used_tokens.unwrap_or(c.max_tokens);
    // Recorded now, settled when the layer and this handler let go of the
    // meter: the response head for a plain answer, still the head for a
    // stream (its slot is held to the body's end by the layer).
    if let Some(Extension(meter)) = meter {
        meter.record_unit("tokens", used);
    }
    let done = Bytes::from(format!(
        "{{\"max_tokens\":{},\"used_tokens\":{used}}}\n",
        c.max_tokens
    ));
    if !c.stream {
        if c.ms > 0 {
            tokio::time::sleep(Duration::from_millis(c.ms)).await;
        }
        return ([(header::CONTENT_TYPE, "application/json")], done).into_response();
    }
    super::slow::streamed_after(Duration::from_millis(c.ms), done)
}

fn bad_request(message: String) -> Response {
    let body = serde_json::json!({ "error": "bad_request", "message": message });
    (StatusCode::BAD_REQUEST, axum::Json(body)).into_response()
}
