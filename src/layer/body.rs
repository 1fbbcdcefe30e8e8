//! The response bodies the layer can answer in.
//!
//! The layer passes a request on to the service it wraps and returns that
//! service's response, so its own answers (429, 503, 400, 401) must be of
//! the same type: `http::Response<B>` for the service's body `B`.
//! [`RefusalBody`] is what the layer needs of `B`, implemented for the
//! common bodies: axum's, tonic's (feature `tonic`), http-body-util's
//! `Full`, `BoxBody` and `UnsyncBoxBody`, and `String`, `Vec<u8>`,
//! `Bytes` for plain `tower::service_fn` services.
//!
//! ```
//! use ratewatch::layer::RefusalBody;
//! let body = <String as RefusalBody>::from_bytes(bytes::Bytes::from_static(b"{}"));
//! assert_eq!(body, "{}");
//! ```

use std::convert::Infallible;

use bytes::Bytes;
use http_body_util::BodyExt;
use http_body_util::combinators::{BoxBody, UnsyncBoxBody};
use http_body_util::{Empty, Full};

/// A response body the layer can build its own answers in.
///
/// Implement it for a body type of your own; for a body from another
/// crate, wrap the service's response body or ask for an implementation
/// here (Rust's orphan rule keeps you from implementing it for a foreign
/// type).
pub trait RefusalBody: Sized + Send + 'static {
    /// A body holding `bytes` (ratewatch's JSON answer, or nothing for a
    /// gRPC status).
    fn from_bytes(bytes: Bytes) -> Self;

    /// A body of this type from the axum body an app's own refusal
    /// (`with_refusal`) was built in: `Ok` when it converts at once, `Err`
    /// to have the layer read it whole and call
    /// [`RefusalBody::from_bytes`]. axum's own body converts at once.
    fn from_axum_body(body: axum::body::Body) -> Result<Self, axum::body::Body> {
        Err(body)
    }
}

impl RefusalBody for axum::body::Body {
    fn from_bytes(bytes: Bytes) -> Self {
        axum::body::Body::from(bytes)
    }

    fn from_axum_body(body: axum::body::Body) -> Result<Self, axum::body::Body> {
        Ok(body)
    }
}

impl RefusalBody for String {
    /// The bytes as UTF-8 (ratewatch's own answers are); anything else
    /// is replaced, never a panic.
    fn from_bytes(bytes: Bytes) -> Self {
        match String::from_utf8(bytes.into()) {
            Ok(s) => s,
            Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
        }
    }
}

impl RefusalBody for Vec<u8> {
    fn from_bytes(bytes: Bytes) -> Self {
        bytes.into()
    }
}

impl RefusalBody for Bytes {
    fn from_bytes(bytes: Bytes) -> Self {
        bytes
    }
}

impl RefusalBody for Full<Bytes> {
    fn from_bytes(bytes: Bytes) -> Self {
        Full::new(bytes)
    }
}

impl<E: Send + Sync + 'static> RefusalBody for BoxBody<Bytes, E> {
    fn from_bytes(bytes: Bytes) -> Self {
        Full::new(bytes)
            .map_err(|never: Infallible| match never {})
            .boxed()
    }
}

impl<E: Send + 'static> RefusalBody for UnsyncBoxBody<Bytes, E> {
    fn from_bytes(bytes: Bytes) -> Self {
        Full::new(bytes)
            .map_err(|never: Infallible| match never {})
            .boxed_unsync()
    }
}

impl RefusalBody for Empty<Bytes> {
    /// An empty body cannot hold the answer: the status and headers say
    /// what happened.
    fn from_bytes(_: Bytes) -> Self {
        Empty::new()
    }
}

#[cfg(feature = "tonic")]
impl RefusalBody for tonic::body::Body {
    fn from_bytes(bytes: Bytes) -> Self {
        if bytes.is_empty() {
            tonic::body::Body::empty()
        } else {
            tonic::body::Body::new(Full::new(bytes))
        }
    }
}

/// `body`, read whole, as a `B`; an error reading it gives an empty body
/// (the status and headers still say what happened).
pub(super) async fn read_whole<B: RefusalBody>(body: axum::body::Body) -> B {
    let bytes = axum::body::to_bytes(body, usize::MAX)
        .await
        .unwrap_or_default();
    B::from_bytes(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_apps_axum_refusal_reads_into_a_string_body() {
        let body = axum::body::Body::from("problem");
        let Err(body) = String::from_axum_body(body) else {
            panic!("a String cannot take an axum body at once");
        };
        assert_eq!(read_whole::<String>(body).await, "problem");
    }

    #[test]
    fn invalid_utf8_never_panics() {
        assert_eq!(
            String::from_bytes(Bytes::from_static(b"a\xffb")),
            "a\u{fffd}b"
        );
    }
}
