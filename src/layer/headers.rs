//! The rate-limit response headers.
//!
//! - `RateLimit-Policy: "burst";q=10;w=30, "day";q=1000;w=86400` — every
//!   enforced limit (IETF draft-ietf-httpapi-ratelimit-headers).
//! - `RateLimit: "burst";r=3;t=12` — the most constraining limit: `r`
//!   units left (floored), `t` seconds until it returns (rounded up); when
//!   blocked, `t` is the retry time, so `Retry-After` is never earlier.
//! - `X-RateLimit-Limit`, `X-RateLimit-Remaining`, `X-RateLimit-Reset`
//!   (UTC epoch seconds, as GitHub sends it) for the same limit.

use std::time::Duration;

use http::{HeaderMap, HeaderName, HeaderValue};

use crate::Decision;
use crate::clock::{MICROS_PER_SEC, Micros};

/// `RateLimit-Policy`.
pub const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
/// `RateLimit`.
pub const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
/// `X-RateLimit-Limit`.
pub const X_RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
/// `X-RateLimit-Remaining`.
pub const X_RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
/// `X-RateLimit-Reset`.
pub const X_RATELIMIT_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");

/// Whole seconds, rounded up.
pub fn ceil_secs(d: Duration) -> u64 {
    d.as_micros().div_ceil(MICROS_PER_SEC as u128) as u64
}

/// The seconds of `t` for the most constraining limit of `d`.
pub fn seconds_until_return(d: &Decision) -> u64 {
    match (d.allowed, d.retry_after, d.most_constraining()) {
        (false, Some(retry), _) => ceil_secs(retry),
        (_, _, Some(l)) => ceil_secs(l.reset_after),
        _ => 0,
    }
}

/// Adds the rate-limit headers of `d` (decided at `now`) to `h`. A decision
/// without enforced limits (a fallback) adds none.
pub fn insert(h: &mut HeaderMap, d: &Decision, now: Micros) {
    let policy: Vec<String> = d
        .limits
        .iter()
        .filter(|l| !l.shadow)
        .map(|l| format!("{};q={};w={}", sf_string(&l.name), l.quota, l.window_secs))
        .collect();
    let Some(top) = d.most_constraining() else {
        return;
    };
    let remaining = top.remaining.max(0.0).floor() as u64;
    let t = seconds_until_return(d);
    let values = [
        (RATELIMIT_POLICY, policy.join(", ")),
        (
            RATELIMIT,
            format!("{};r={remaining};t={t}", sf_string(&top.name)),
        ),
        (X_RATELIMIT_LIMIT, top.quota.to_string()),
        (X_RATELIMIT_REMAINING, remaining.to_string()),
        (X_RATELIMIT_RESET, (now / MICROS_PER_SEC + t).to_string()),
    ];
    for (name, value) in values {
        if let Ok(v) = HeaderValue::from_str(&value) {
            h.insert(name, v);
        }
    }
}

/// A structured-field string: quoted, with `\` and `"` escaped. Limit names
/// are validated to `[A-Za-z0-9_-]`, so this never has to drop a character.
fn sf_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars().filter(|c| (' '..='~').contains(c)) {
        if c == '"' || c == '\\' {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn structured_strings_are_quoted_and_escaped() {
        assert_eq!(sf_string("burst"), "\"burst\"");
        assert_eq!(sf_string("a\"b\\c"), "\"a\\\"b\\\\c\"");
    }

    #[test]
    fn seconds_round_up() {
        assert_eq!(ceil_secs(Duration::from_micros(1)), 1);
        assert_eq!(ceil_secs(Duration::from_secs(2)), 2);
        assert_eq!(ceil_secs(Duration::from_millis(2001)), 3);
    }
}
