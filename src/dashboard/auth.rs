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
    let policy = limiter.policy();
    let settings = &policy.dashboard;
    if !settings.enabled {
        return StatusCode::NOT_FOUND.into_response();
    }
    if !settings.allow_remote {
        // The client as the limiter sees it: the peer, or the first
        // untrusted X-Forwarded-For hop behind a trusted proxy. Unknown
        // (no ConnectInfo) is not loopback.
        let client = crate::identity::client_ip(
            &policy.identity.trusted_proxies,
            req.headers(),
            crate::identity::peer_ip(req.extensions()),
        )
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
    let mut set_cookie = false;
    if let Some(token) = &settings.token {
        let header_value = |name| req.headers().get(name).and_then(|v| v.to_str().ok());
        let bearer = header_value(header::AUTHORIZATION).and_then(|v| v.strip_prefix("Bearer "));
        let cookie = header_value(header::COOKIE).and_then(|c| {
            c.split(';')
                .find_map(|kv| kv.trim().strip_prefix("ratewatch_dashboard="))
        });
        let query = axum::extract::Query::<TokenQuery>::try_from_uri(req.uri())
            .ok()
            .and_then(|q| q.0.token);
        let ok = |given: Option<&str>| {
            given.is_some_and(|g| constant_time_eq(g.as_bytes(), token.as_bytes()))
        };
        if !(ok(bearer) || ok(cookie)) {
            if !ok(query.as_deref()) {
                return (
                    StatusCode::UNAUTHORIZED,
                    [(header::WWW_AUTHENTICATE, "Bearer")],
                    "the dashboard requires Authorization: Bearer <token>",
                )
                    .into_response();
            }
            // A browser that came with ?token= keeps it in a cookie, so
            // links and refreshes need not carry it in the URL.
            set_cookie = true;
        }
    }
    let mut res = next.run(req).await;
    if set_cookie {
        if let Some(token) = &settings.token {
            let cookie = format!("{COOKIE}={token}; HttpOnly; SameSite=Strict; Path=/");
            if let Ok(v) = http::HeaderValue::from_str(&cookie) {
                res.headers_mut().insert(header::SET_COOKIE, v);
            }
        }
    }
    res
}

/// The cookie that carries the dashboard token after a `?token=` visit.
const COOKIE: &str = "ratewatch_dashboard";

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
