//! Who may see the dashboard: loopback peers unless `allow_remote`, and
//! only with the bearer token when one is configured.

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http::{StatusCode, header};

use crate::Limiter;

#[derive(serde::Deserialize)]
struct TokenQuery {
    token: Option<String>,
}

pub(super) async fn guard(State(limiter): State<Limiter>, req: Request, next: Next) -> Response {
    let settings = &limiter.policy().dashboard;
    if !settings.enabled {
        return StatusCode::NOT_FOUND.into_response();
    }
    if !settings.allow_remote {
        // The client as the limiter sees it: the peer, or the first
        // untrusted X-Forwarded-For hop behind a trusted proxy. Unknown
        // (no ConnectInfo) is not loopback.
        let extractor = crate::identity::HeaderExtractor::new(limiter.policy().identity.clone());
        let client = extractor
            .client_ip(req.headers(), crate::identity::peer_ip(req.extensions()))
            .ok()
            .flatten();
        if !client.is_some_and(|ip| ip.is_loopback()) {
            return (
                StatusCode::FORBIDDEN,
                "the dashboard answers loopback clients only (serve with \
                 into_make_service_with_connect_info, or set [dashboard] allow_remote = true)",
            )
                .into_response();
        }
    }
    if let Some(token) = &settings.token {
        let bearer = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        let query = axum::extract::Query::<TokenQuery>::try_from_uri(req.uri())
            .ok()
            .and_then(|q| q.0.token);
        let given = bearer.map(str::to_owned).or(query).unwrap_or_default();
        if !constant_time_eq(given.as_bytes(), token.as_bytes()) {
            return (
                StatusCode::UNAUTHORIZED,
                [(header::WWW_AUTHENTICATE, "Bearer")],
                "the dashboard requires Authorization: Bearer <token>",
            )
                .into_response();
        }
    }
    next.run(req).await
}

/// Compares without an early exit, so response time does not reveal how
/// much of a guessed token was right.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    #[test]
    fn tokens_compare_equal_only_when_identical() {
        assert!(super::constant_time_eq(b"abc", b"abc"));
        assert!(!super::constant_time_eq(b"abc", b"abd"));
        assert!(!super::constant_time_eq(b"abc", b"abcd"));
    }
}
