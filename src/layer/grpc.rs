//! Refusals of gRPC requests, as gRPC statuses.
//!
//! A gRPC client cannot read an HTTP 429: it needs HTTP 200 with a
//! `grpc-status` (a "trailers-only" response, all in the headers). A
//! request whose `content-type` is `application/grpc` (or `+proto`,
//! `+json`, ...) is answered so, whatever service the layer wraps:
//!
//! | refusal | `grpc-status` |
//! |---|---|
//! | a limit blocked (HTTP would be 429) | 8 `RESOURCE_EXHAUSTED` |
//! | the store cannot decide, the route fails closed (503) | 14 `UNAVAILABLE` |
//! | a malformed identity or conflicting credentials (400) | 3 `INVALID_ARGUMENT` |
//! | a tier the policy does not define (403) | 7 `PERMISSION_DENIED` |
//! | no key, anonymous callers rejected (401) | 16 `UNAUTHENTICATED` |
//!
//! The rate-limit headers and `Retry-After` ride along as response
//! metadata, as on HTTP.

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Response, StatusCode, header};

use super::response::Refusal;

/// `grpc-status`.
pub(crate) const GRPC_STATUS: http::HeaderName = http::HeaderName::from_static("grpc-status");
/// `grpc-message`.
pub(crate) const GRPC_MESSAGE: http::HeaderName = http::HeaderName::from_static("grpc-message");

/// Whether a request with `headers` speaks gRPC.
pub(super) fn is_grpc(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"))
}

impl Refusal<'_> {
    /// The gRPC status code of this refusal (see the module docs).
    pub fn grpc_code(&self) -> u16 {
        match self {
            Refusal::RateLimited { .. } => 8,
            Refusal::Unavailable { .. } => 14,
            // An unknown tier is the app's answer about this caller.
            Refusal::BadIdentity(e) if e.status() == StatusCode::FORBIDDEN => 7,
            Refusal::BadIdentity(_) => 3,
            Refusal::Unauthorized(_) => 16,
        }
    }

    /// ratewatch's answer to a gRPC request: HTTP 200, `grpc-status` and a
    /// `grpc-message` in the headers, no body (the rate-limit headers are
    /// added by the layer).
    pub fn grpc_response(&self) -> Response<Bytes> {
        let mut res = Response::new(Bytes::new());
        *res.status_mut() = StatusCode::OK;
        let h = res.headers_mut();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/grpc"),
        );
        h.insert(GRPC_STATUS, HeaderValue::from(self.grpc_code()));
        if let Ok(v) = HeaderValue::from_str(&percent_encode(&self.message())) {
            h.insert(GRPC_MESSAGE, v);
        }
        res
    }
}

/// `grpc-message` encoding: printable ASCII but `%` as is, every other
/// byte as `%XX`.
fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if (0x20..=0x7e).contains(&b) && b != b'%' {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_messages_are_percent_encoded() {
        assert_eq!(percent_encode("50% off: é"), "50%25 off: %C3%A9");
    }

    #[test]
    fn grpc_content_types_are_recognised() {
        let mut h = HeaderMap::new();
        assert!(!is_grpc(&h));
        h.insert(
            header::CONTENT_TYPE,
            "application/grpc+proto".parse().unwrap(),
        );
        assert!(is_grpc(&h));
        h.insert(header::CONTENT_TYPE, "application/json".parse().unwrap());
        assert!(!is_grpc(&h));
    }
}
