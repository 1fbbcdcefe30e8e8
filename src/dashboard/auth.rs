//! Who may see the dashboard: callers on this host
//! ([`local_caller`](crate::layer::local_caller)) unless `allow_remote`,
//! and only with the bearer token when one is configured. A proxy on this
//! host outside `trusted_proxies` is not a local caller: it is refused
//! unless a token is configured (which it must then send).
//!
//! A browser may come once with `?token=`: it is answered with a redirect
//! to the same URL without the token, setting a cookie that holds a random
//! session id (never the token), scoped to the dashboard's path, `HttpOnly`,
//! `SameSite=Strict`, and `Secure` when the request came over TLS or a
//! trusted proxy says it did.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{OriginalUri, Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http::{StatusCode, header};
use parking_lot::Mutex;

use crate::Limiter;

/// The cookie that carries a dashboard session id after a `?token=` visit.
pub(super) const COOKIE: &str = "ratewatch_dashboard";

/// How long a session lasts.
const SESSION_TTL: Duration = Duration::from_secs(12 * 3600);

/// Most live sessions; the oldest goes first. Each costs a few dozen bytes,
/// and only holders of the token can create one.
const MAX_SESSIONS: usize = 1024;

/// Sessions opened with the token: random ids, when they expire, and the
/// token that opened them (a session is valid only while that token is the
/// configured one, so rotating a leaked token by a reload ends them).
#[derive(Clone, Default)]
pub(super) struct Sessions {
    ids: Arc<Mutex<VecDeque<(String, u64, String)>>>,
}

impl Sessions {
    fn open(&self, now_us: u64, token: &str) -> String {
        use rand::RngCore;
        let mut bytes = [0u8; 32];
        rand::rng().fill_bytes(&mut bytes);
        let id: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        let mut ids = self.ids.lock();
        ids.retain(|(_, exp, _)| *exp > now_us);
        while ids.len() >= MAX_SESSIONS {
            ids.pop_front();
        }
        ids.push_back((
            id.clone(),
            now_us + SESSION_TTL.as_micros() as u64,
            token.to_owned(),
        ));
        id
    }

    fn valid(&self, given: &str, now_us: u64, token: &str) -> bool {
        // Compared without an early exit per id, like the token.
        self.ids
            .lock()
            .iter()
            .fold(false, |found, (id, exp, opened_by)| {
                found
                    | (*exp > now_us
                        && constant_time_eq(id.as_bytes(), given.as_bytes())
                        && constant_time_eq(opened_by.as_bytes(), token.as_bytes()))
            })
    }
}

#[derive(Clone)]
pub(super) struct Guard {
    pub(super) limiter: Limiter,
    pub(super) sessions: Sessions,
}

#[derive(serde::Deserialize)]
struct TokenQuery {
    token: Option<String>,
}

pub(super) async fn guard(State(g): State<Guard>, req: Request, next: Next) -> Response {
    match admit(&g, &req) {
        None => next.run(req).await,
        Some(answer) => answer,
    }
}

/// `None` lets the request through; otherwise the answer (403, 401, or the
/// redirect that trades a `?token=` for a session).
fn admit(g: &Guard, req: &Request) -> Option<Response> {
    let limiter = &g.limiter;
    let policy = limiter.policy();
    let settings = &policy.dashboard;
    if !settings.enabled {
        return Some(StatusCode::NOT_FOUND.into_response());
    }
    let trusted = &policy.identity.trusted_proxies;
    let peer = crate::identity::peer_ip(req.extensions()).map(|ip| ip.to_canonical());
    let via_proxy = peer.is_some_and(|p| trusted.iter().any(|n| n.contains(&p)));
    if !settings.allow_remote {
        match crate::layer::local_caller(trusted, req.headers(), peer) {
            Ok(()) => {}
            // A proxy on this host may bring remote users to a dashboard
            // that requires the token: the token decides, below.
            Err(crate::layer::NotLocal::UntrustedProxy) if settings.token.is_some() => {}
            Err(why) => {
                let message = format!(
                    "the dashboard answers callers on this host only (set [dashboard] \
                     allow_remote = true, or a token to serve it through a proxy): {}",
                    why.reason()
                );
                return Some((StatusCode::FORBIDDEN, message).into_response());
            }
        }
    }
    let Some(token) = &settings.token else {
        return None;
    };
    let now = limiter.clock().now_us();
    let header_value = |name| req.headers().get(name).and_then(|v| v.to_str().ok());
    // The scheme is case-insensitive (RFC 9110), as the limiter reads it.
    let bearer = header_value(header::AUTHORIZATION)
        .and_then(|v| v.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, token)| token.trim());
    let session = header_value(header::COOKIE).and_then(|c| {
        c.split(';')
            .find_map(|kv| kv.trim().strip_prefix(COOKIE)?.strip_prefix('='))
    });
    let token_ok = |given: Option<&str>| {
        given.is_some_and(|g| constant_time_eq(g.as_bytes(), token.as_bytes()))
    };
    if token_ok(bearer) || session.is_some_and(|s| g.sessions.valid(s, now, token)) {
        return None;
    }
    let query = axum::extract::Query::<TokenQuery>::try_from_uri(req.uri())
        .ok()
        .and_then(|q| q.0.token);
    if !token_ok(query.as_deref()) {
        return Some(
            (
                StatusCode::UNAUTHORIZED,
                [(header::WWW_AUTHENTICATE, "Bearer")],
                "the dashboard requires Authorization: Bearer <token>",
            )
                .into_response(),
        );
    }
    // The token was right, in the URL: trade it for a session and send the
    // browser to the same URL without it, so it stays out of history,
    // logs and Referer headers.
    let full = req
        .extensions()
        .get::<OriginalUri>()
        .map_or_else(|| req.uri().clone(), |o| o.0.clone());
    let scope = cookie_path(full.path(), req.uri().path());
    let secure = came_over_tls(req, via_proxy);
    let id = g.sessions.open(now, token);
    let cookie = format!(
        "{COOKIE}={id}; HttpOnly; SameSite=Strict; Path={scope}; Max-Age={}{}",
        SESSION_TTL.as_secs(),
        if secure { "; Secure" } else { "" }
    );
    let location = without_token(full.path(), full.query());
    let mut res = StatusCode::SEE_OTHER.into_response();
    if let (Ok(c), Ok(l)) = (
        http::HeaderValue::from_str(&cookie),
        http::HeaderValue::from_str(&location),
    ) {
        res.headers_mut().insert(header::SET_COOKIE, c);
        res.headers_mut().insert(header::LOCATION, l);
    }
    res.headers_mut().insert(
        header::CACHE_CONTROL,
        http::HeaderValue::from_static("no-store"),
    );
    Some(res)
}

/// TLS on this hop (an `https` request URI), or a trusted proxy saying the
/// client's hop was TLS (`X-Forwarded-Proto: https` or `Forwarded:
/// proto=https`).
fn came_over_tls(req: &Request, via_proxy: bool) -> bool {
    if req.uri().scheme_str() == Some("https") {
        return true;
    }
    if !via_proxy {
        return false;
    }
    let h = req.headers();
    let proto = h
        .get("x-forwarded-proto")
        .and_then(|v| v.to_str().ok())
        .map(|v| {
            v.split(',')
                .next()
                .unwrap_or("")
                .trim()
                .eq_ignore_ascii_case("https")
        });
    let forwarded = h
        .get(header::FORWARDED)
        .and_then(|v| v.to_str().ok())
        .map(|v| {
            v.split([';', ','])
                .any(|kv| kv.trim().eq_ignore_ascii_case("proto=https"))
        });
    proto.unwrap_or(false) || forwarded.unwrap_or(false)
}

/// The dashboard's own path: the full path minus what the nested router
/// saw (`/ops/dashboard/api/stats` seen as `/api/stats` gives
/// `/ops/dashboard`).
fn cookie_path(full: &str, inner: &str) -> String {
    let inner = inner.trim_end_matches('/');
    let prefix = full.trim_end_matches('/').strip_suffix(inner).unwrap_or("");
    if prefix.is_empty() || !prefix.starts_with('/') || prefix.contains([';', ',', ' ']) {
        "/".to_owned()
    } else {
        prefix.to_owned()
    }
}

/// `path?query` without its `token` parameter.
fn without_token(path: &str, query: Option<&str>) -> String {
    let kept: Vec<&str> = query
        .unwrap_or("")
        .split('&')
        .filter(|kv| !kv.is_empty() && !is_token_param(kv))
        .collect();
    if kept.is_empty() {
        path.to_owned()
    } else {
        format!("{path}?{}", kept.join("&"))
    }
}

/// Whether a raw `key[=value]` query pair is the `token` parameter, its
/// key percent-decoded as the query extractor decodes it (`%74oken=...`
/// is the token too and must not survive the redirect).
fn is_token_param(kv: &str) -> bool {
    let key = kv.split('=').next().unwrap_or("").as_bytes();
    let mut decoded = Vec::with_capacity(key.len());
    let mut i = 0;
    while i < key.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match (key[i], key.get(i + 1), key.get(i + 2)) {
            (b'%', Some(&h), Some(&l)) if hex(h).is_some() && hex(l).is_some() => {
                decoded.push((hex(h).unwrap_or(0) * 16 + hex(l).unwrap_or(0)) as u8);
                i += 3;
            }
            (b'+', ..) => {
                decoded.push(b' ');
                i += 1;
            }
            (b, ..) => {
                decoded.push(b);
                i += 1;
            }
        }
    }
    decoded == b"token"
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
    use super::*;

    #[test]
    fn tokens_compare_equal_only_when_identical() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"abcd"));
    }

    #[test]
    fn the_cookie_is_scoped_to_where_the_dashboard_is_nested() {
        assert_eq!(cookie_path("/dashboard", "/"), "/dashboard");
        assert_eq!(cookie_path("/dashboard/", "/"), "/dashboard");
        assert_eq!(
            cookie_path("/ops/dash/api/stats", "/api/stats"),
            "/ops/dash"
        );
        assert_eq!(cookie_path("/api/stats", "/api/stats"), "/");
    }

    #[test]
    fn the_redirect_drops_only_the_token() {
        assert_eq!(without_token("/d", Some("token=x")), "/d");
        assert_eq!(
            without_token("/d", Some("range=5m&token=x&a=1")),
            "/d?range=5m&a=1"
        );
        assert_eq!(without_token("/d", None), "/d");
    }

    #[test]
    fn sessions_are_random_and_expire() {
        let s = Sessions::default();
        let a = s.open(0, "t");
        let b = s.open(0, "t");
        assert_ne!(a, b);
        assert_eq!(a.len(), 64);
        assert!(s.valid(&a, 1, "t"));
        assert!(!s.valid(&a, 1, "rotated"));
        assert!(!s.valid("nope", 1, "t"));
        assert!(!s.valid(&a, SESSION_TTL.as_micros() as u64 + 1, "t"));
    }
}
