//! The rate-limit response headers.
//!
//! - `RateLimit-Policy: "burst";q=10;w=30, "day";q=1000;w=86400` — every
//!   enforced limit (IETF draft-ietf-httpapi-ratelimit-headers).
//! - `RateLimit: "burst";r=3;t=12` — the most constraining limit: `r`
//!   units left (floored), `t` seconds until it returns (rounded up); when
//!   blocked, `t` is the retry time, so `Retry-After` is never earlier.
//! - `X-RateLimit-Limit`, `X-RateLimit-Remaining`, `X-RateLimit-Reset`
//!   (UTC epoch seconds, as GitHub sends it) for the same limit.

use std::cell::RefCell;
use std::fmt::Write as _;
use std::time::Duration;

use http::{HeaderMap, HeaderName, HeaderValue};

use crate::Decision;
use crate::clock::MICROS_PER_SEC;

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

/// How long until the most constraining limit of `d` returns: the retry
/// time when blocked, else the limit's reset.
pub fn until_return(d: &Decision) -> Duration {
    match (d.allowed, d.retry_after, d.most_constraining()) {
        (false, Some(retry), _) => retry,
        (_, _, Some(l)) => l.reset_after,
        _ => Duration::ZERO,
    }
}

/// The `t` of the `RateLimit` header: [`until_return`] in whole seconds,
/// rounded up.
pub fn seconds_until_return(d: &Decision) -> u64 {
    ceil_secs(until_return(d))
}

/// Which header families a limited response carries. All are on by
/// default; `Retry-After` on a 429 or 503 is governed by `retry_after`.
///
/// ```
/// use ratewatch::layer::HeaderFamilies;
/// let only_ietf = HeaderFamilies { x_ratelimit: false, ..HeaderFamilies::default() };
/// assert!(only_ietf.ietf && only_ietf.retry_after);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeaderFamilies {
    /// `RateLimit-Policy` and `RateLimit` (the IETF draft fields).
    pub ietf: bool,
    /// `X-RateLimit-Limit`, `X-RateLimit-Remaining`, `X-RateLimit-Reset`.
    pub x_ratelimit: bool,
    /// `Retry-After` on refusals (429, 503).
    pub retry_after: bool,
}

impl Default for HeaderFamilies {
    fn default() -> Self {
        Self::ALL
    }
}

impl HeaderFamilies {
    /// Every family.
    pub const ALL: Self = Self {
        ietf: true,
        x_ratelimit: true,
        retry_after: true,
    };
    /// No header at all.
    pub const NONE: Self = Self {
        ietf: false,
        x_ratelimit: false,
        retry_after: false,
    };
}

/// Adds every rate-limit header of `d` to `h`. Times are counted from when
/// the store decided (Redis `TIME` on Redis). A fallback that counted
/// nothing adds `RateLimit-Policy` only.
pub fn insert(h: &mut HeaderMap, d: &Decision) {
    insert_families(h, d, HeaderFamilies::ALL);
}

/// Adds the rate-limit headers of `d` in `families` to `h` (`Retry-After`
/// is not one of them: refusals add it).
pub fn insert_families(h: &mut HeaderMap, d: &Decision, families: HeaderFamilies) {
    // One scratch buffer per thread for every value: this runs on every
    // response, and a buffer of its own was an allocation each time.
    SCRATCH.with(|scratch| match scratch.try_borrow_mut() {
        Ok(mut buf) => write_families(h, d, families, &mut buf),
        Err(_) => write_families(h, d, families, &mut String::new()),
    });
}

fn write_families(h: &mut HeaderMap, d: &Decision, families: HeaderFamilies, buf: &mut String) {
    // Room for all five at once: the map grows once, not header by header.
    h.reserve(5);
    if families.ietf {
        insert_policy(h, d, buf);
    }
    if !(families.ietf || families.x_ratelimit) {
        return;
    }
    // Nothing counted (an open or closed fallback): no remaining to show.
    let Some((top, left)) = d
        .most_constraining()
        .and_then(|top| Some((top, top.remaining?)))
    else {
        return;
    };
    let remaining = left.max(0.0).floor() as u64;
    let until = until_return(d);
    if families.ietf {
        let t = ceil_secs(until);
        buf.clear();
        push_sf_string(buf, &top.name);
        let _ = write!(buf, ";r={remaining};t={t}");
        put(h, RATELIMIT, buf);
    }
    if families.x_ratelimit {
        // The epoch second at or after which quota is back: rounded up, so
        // a client waiting until then is never early.
        let reset = (d.decided_at + until.as_micros() as u64).div_ceil(MICROS_PER_SEC);
        h.insert(
            X_RATELIMIT_LIMIT,
            cached(&QUOTA, top.quota, |b| {
                let _ = write!(b, "{}", top.quota);
            }),
        );
        h.insert(X_RATELIMIT_REMAINING, HeaderValue::from(remaining));
        // Many responses share a reset second: one value per second per
        // thread, not a formatted copy each.
        h.insert(
            X_RATELIMIT_RESET,
            cached(&RESET, reset, |b| {
                let _ = write!(b, "{reset}");
            }),
        );
    }
}

fn put(h: &mut HeaderMap, name: HeaderName, value: &str) {
    if let Ok(v) = HeaderValue::from_str(value) {
        h.insert(name, v);
    }
}

thread_local! {
    /// The last `RateLimit-Policy` value this thread built, by its text: a
    /// tier's policy rarely changes, so most responses share one value
    /// (a reference count, not a copy).
    static POLICY: RefCell<Option<(String, HeaderValue)>> = const { RefCell::new(None) };
    /// The last `X-RateLimit-Limit` value, by quota.
    static QUOTA: RefCell<Option<(u64, HeaderValue)>> = const { RefCell::new(None) };
    /// The last `X-RateLimit-Reset` value, by epoch second.
    static RESET: RefCell<Option<(u64, HeaderValue)>> = const { RefCell::new(None) };
    /// The buffer header values are written into.
    static SCRATCH: RefCell<String> = const { RefCell::new(String::new()) };
}

/// The value for `key` from a one-entry per-thread memo, built by `write`
/// when the key changed.
fn cached(
    memo: &'static std::thread::LocalKey<RefCell<Option<(u64, HeaderValue)>>>,
    key: u64,
    write: impl FnOnce(&mut String),
) -> HeaderValue {
    memo.with_borrow_mut(|m| match m {
        Some((k, v)) if *k == key => v.clone(),
        _ => {
            let mut text = String::new();
            write(&mut text);
            let v = HeaderValue::from_str(&text).unwrap_or(HeaderValue::from_static("0"));
            *m = Some((key, v.clone()));
            v
        }
    })
}

fn insert_policy(h: &mut HeaderMap, d: &Decision, buf: &mut String) {
    buf.clear();
    for l in d.limits.iter().filter(|l| !l.shadow) {
        if !buf.is_empty() {
            buf.push_str(", ");
        }
        push_sf_string(buf, &l.name);
        let _ = write!(buf, ";q={};w={}", l.quota, l.window_secs);
    }
    if buf.is_empty() {
        return;
    }
    let value = POLICY.with_borrow_mut(|m| match m {
        Some((text, v)) if text == buf => Some(v.clone()),
        _ => {
            let v = HeaderValue::from_str(buf).ok()?;
            *m = Some((buf.clone(), v.clone()));
            Some(v)
        }
    });
    if let Some(v) = value {
        h.insert(RATELIMIT_POLICY, v);
    }
}

/// Appends `s` to `out` as a structured-field string.
fn push_sf_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars().filter(|c| (' '..='~').contains(c)) {
        if c == '"' || c == '\\' {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
}

/// A structured-field string: quoted, with `\\` and `"` escaped. Limit names
/// are validated to `[A-Za-z0-9_-]`, so this never has to drop a character.
#[cfg(test)]
fn sf_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    push_sf_string(&mut out, s);
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
