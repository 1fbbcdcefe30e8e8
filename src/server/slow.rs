//! `GET /api/slow?ms=N`: a request that takes `N` milliseconds (at most
//! 10,000), to show in-flight limits at work. With `&stream=true` the
//! status, headers and a first chunk go out at once and the body ends `N`
//! ms later, so a streamed response holds its slot to its last chunk.
//! Anything else in `ms` is a 400, never a panic.

use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::response::{IntoResponse, Response};
use http::{StatusCode, Uri, header};

/// The longest a slow request may take.
pub const MAX_SLOW_MS: u64 = 10_000;

/// What a query asks for: how long, and whether to stream.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Slow {
    ms: u64,
    stream: bool,
}

/// Reads `ms` (required, 0..=10000, decimal digits only) and `stream`
/// (`true`/`false`, optional) from a query; the error says what is wrong.
pub(super) fn parse(query: Option<&str>) -> Result<Slow, String> {
    let mut ms = None;
    let mut stream = false;
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        match k {
            "ms" => {
                let n = (!v.is_empty() && v.len() <= 5 && v.bytes().all(|b| b.is_ascii_digit()))
                    .then(|| v.parse::<u64>().ok())
                    .flatten()
                    .filter(|&n| n <= MAX_SLOW_MS);
                ms = Some(n.ok_or_else(|| {
                    format!("`ms` must be a whole number of milliseconds from 0 to {MAX_SLOW_MS}")
                })?);
            }
            "stream" => {
                stream = match v {
                    "true" | "1" => true,
                    "false" | "0" => false,
                    _ => return Err("`stream` must be true or false".into()),
                }
            }
            _ => {}
        }
    }
    let ms = ms.ok_or_else(|| format!("`ms` is required (0 to {MAX_SLOW_MS})"))?;
    Ok(Slow { ms, stream })
}

pub(super) async fn slow(uri: Uri) -> Response {
    let Slow { ms, stream } = match parse(uri.query()) {
        Ok(s) => s,
        Err(e) => {
            let body = serde_json::json!({ "error": "bad_request", "message": e });
            return (StatusCode::BAD_REQUEST, axum::Json(body)).into_response();
        }
    };
    let wait = Duration::from_millis(ms);
    let done = Bytes::from(format!("{{\"slept_ms\":{ms}}}\n"));
    if !stream {
        tokio::time::sleep(wait).await;
        return ([(header::CONTENT_TYPE, "application/json")], done).into_response();
    }
    streamed_after(wait, done)
}

/// A JSON answer streamed: a first byte at once (so the client has the
/// head and the body has begun), then `done` after `wait`. The request's
/// in-flight slot is held until the body ends.
pub(super) fn streamed_after(wait: Duration, done: Bytes) -> Response {
    let chunks = futures_util::stream::unfold(0u8, move |step| {
        let done = done.clone();
        async move {
            match step {
                0 => Some((
                    Ok::<_, std::convert::Infallible>(Bytes::from_static(b" ")),
                    1,
                )),
                1 => {
                    tokio::time::sleep(wait).await;
                    Some((Ok(done), 2))
                }
                _ => None,
            }
        }
    });
    (
        [(header::CONTENT_TYPE, "application/json")],
        Body::from_stream(chunks),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slow_query_takes_ms_up_to_ten_seconds_and_nothing_else() {
        assert_eq!(
            parse(Some("ms=250")),
            Ok(Slow {
                ms: 250,
                stream: false
            })
        );
        assert_eq!(
            parse(Some("ms=10000&stream=true")),
            Ok(Slow {
                ms: 10_000,
                stream: true
            })
        );
        for bad in [
            None,
            Some(""),
            Some("ms="),
            Some("ms=10001"),
            Some("ms=-1"),
            Some("ms=1e3"),
            Some("ms=99999999999999999999999"),
            Some("ms=+5"),
            Some("ms=5&stream=maybe"),
        ] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
    }
}
