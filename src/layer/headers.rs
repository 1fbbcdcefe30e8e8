//! The rate-limit response headers.
//!
//! - `RateLimit-Policy: "burst";q=10;w=30, "day";q=1000;w=86400` — every
//!   enforced limit (IETF draft-ietf-httpapi-ratelimit-headers).
//! - `RateLimit: "burst";r=3;t=12` — the most constraining limit: `r`
//!   units left (floored), `t` seconds until it returns (rounded up); when
//!   blocked, `t` is the retry time, so `Retry-After` is never earlier.
//! - `X-RateLimit-Limit`, `X-RateLimit-Remaining`, `X-RateLimit-Reset`
//!   (UTC epoch seconds, as GitHub sends it) for the most constraining
//!   limit counting requests.
//!
//! Limits count units ([`Limit::unit`](crate::Limit::unit)). For every unit
//! the decision's enforced limits count, the tightest limit of that unit
//! is also sent as `x-ratelimit-limit-<unit>`, `x-ratelimit-remaining-<unit>`
//! and `x-ratelimit-reset-<unit>` (epoch seconds, like `X-RateLimit-Reset`):
//! `x-ratelimit-remaining-requests`, `x-ratelimit-remaining-tokens`. With
//! several units, `RateLimit` lists the most constraining limit first, then
//! the tightest limit of each other unit, and `RateLimit-Policy` gives a
//! limit of a unit other than requests its unit as `qu`:
//! `"tpm";q=100000;w=60;qu="tokens"`.

use std::cell::RefCell;
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderMap, HeaderName, HeaderValue};

use crate::clock::MICROS_PER_SEC;
use crate::decimal::push_u64;
use crate::policy::REQUESTS;
use crate::{Decision, LimitReport};

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
/// `x-ratelimit-limit-requests`.
pub const X_RATELIMIT_LIMIT_REQUESTS: HeaderName =
    HeaderName::from_static("x-ratelimit-limit-requests");
/// `x-ratelimit-remaining-requests`.
pub const X_RATELIMIT_REMAINING_REQUESTS: HeaderName =
    HeaderName::from_static("x-ratelimit-remaining-requests");
/// `x-ratelimit-reset-requests`.
pub const X_RATELIMIT_RESET_REQUESTS: HeaderName =
    HeaderName::from_static("x-ratelimit-reset-requests");

/// The names `x-ratelimit-limit-<unit>`, `x-ratelimit-remaining-<unit>`
/// and `x-ratelimit-reset-<unit>`; `None` for a name no header can carry
/// (a unit the policy checks never is).
pub fn unit_header_names(unit: &str) -> Option<[HeaderName; 3]> {
    if unit == REQUESTS {
        return Some([
            X_RATELIMIT_LIMIT_REQUESTS,
            X_RATELIMIT_REMAINING_REQUESTS,
            X_RATELIMIT_RESET_REQUESTS,
        ]);
    }
    let name = |family: &str| {
        HeaderName::from_bytes(format!("x-ratelimit-{family}-{unit}").as_bytes()).ok()
    };
    Some([name("limit")?, name("remaining")?, name("reset")?])
}

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
    // Room for every header at once, and for the `content-length` the
    // server adds after them: the map grows once, not header by header.
    let other_units = d.units().filter(|u| u.as_ref() != REQUESTS).count();
    h.reserve(8 + 3 * other_units + 1);
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
    // The common decision: every limit counts one unit (requests).
    let single = d.limits.iter().all(|l| l.shadow || l.unit == top.unit);
    if families.ietf {
        let t = ceil_secs(until);
        if single {
            // One limit's `r` and `t`: a caller far from its limit sees
            // the same pair response after response, so the last value is
            // kept per thread (a reference count, not a formatted copy).
            let value = RATELIMIT_MEMO.with_borrow_mut(|m| match m {
                Some((name, r, secs, v))
                    if *r == remaining && *secs == t && same_text(name, &top.name) =>
                {
                    Some(v.clone())
                }
                _ => {
                    buf.clear();
                    push_sf_string(buf, &top.name);
                    push_member_state(buf, remaining, t);
                    let v = HeaderValue::from_str(buf).ok()?;
                    *m = Some((top.name.clone(), remaining, t, v.clone()));
                    Some(v)
                }
            });
            if let Some(v) = value {
                h.insert(RATELIMIT, v);
            }
        } else {
            buf.clear();
            push_sf_string(buf, &top.name);
            push_member_state(buf, remaining, t);
            for unit in d.units().filter(|u| **u != top.unit) {
                if let Some((l, r, until)) = tightest(d, unit) {
                    buf.push_str(", ");
                    push_sf_string(buf, &l.name);
                    push_member_state(buf, r, ceil_secs(until));
                }
            }
            put(h, RATELIMIT, buf);
        }
    }
    if !families.x_ratelimit {
        return;
    }
    let requests = if top.unit.as_ref() == REQUESTS {
        Some((top, remaining, until))
    } else if single {
        None
    } else {
        tightest(d, REQUESTS)
    };
    if let Some((l, remaining, until)) = requests {
        let reset = reset_second(d, until);
        let quota = cached(&QUOTA, l.quota, |b| push_u64(b, l.quota));
        let left = if remaining < READY_NUMBERS {
            number(remaining)
        } else {
            cached(&REMAINING, remaining, |b| push_u64(b, remaining))
        };
        // Many responses share a reset second: one value per second per
        // thread, not a formatted copy each.
        let reset = cached(&RESET, reset, |b| push_u64(b, reset));
        h.insert(X_RATELIMIT_LIMIT_REQUESTS, quota.clone());
        h.insert(X_RATELIMIT_REMAINING_REQUESTS, left.clone());
        h.insert(X_RATELIMIT_RESET_REQUESTS, reset.clone());
        h.insert(X_RATELIMIT_LIMIT, quota);
        h.insert(X_RATELIMIT_REMAINING, left);
        h.insert(X_RATELIMIT_RESET, reset);
    }
    if single && requests.is_some() {
        return;
    }
    for unit in d.units().filter(|u| u.as_ref() != REQUESTS) {
        let (Some((l, remaining, until)), Some([limit, left, reset])) =
            (tightest(d, unit), unit_names(unit))
        else {
            continue;
        };
        h.insert(limit, number(l.quota));
        h.insert(left, number(remaining));
        h.insert(reset, HeaderValue::from(reset_second(d, until)));
    }
}

/// The epoch second at or after which quota is back `until` after the
/// decision: rounded up, so a client waiting until then is never early.
fn reset_second(d: &Decision, until: Duration) -> u64 {
    (d.decided_at + until.as_micros() as u64).div_ceil(MICROS_PER_SEC)
}

/// The tightest limit of `unit` ([`Decision::most_constraining_in`]), its
/// whole units left and how long until its quota returns (its retry time
/// when it refused the request).
fn tightest<'d>(d: &'d Decision, unit: &str) -> Option<(&'d LimitReport, u64, Duration)> {
    let l = d.most_constraining_in(unit)?;
    let left = l.remaining?.max(0.0).floor() as u64;
    let until = if l.allowed {
        l.reset_after
    } else {
        l.retry_after
    };
    Some((l, left, until))
}

/// The largest number [`number`] has a ready value for.
const READY_NUMBERS: u64 = 1024;

/// `n` as a header value: for small numbers (most remaining counts) a
/// value made once and shared, so a response allocates nothing for it.
fn number(n: u64) -> HeaderValue {
    static READY: std::sync::OnceLock<Vec<HeaderValue>> = std::sync::OnceLock::new();
    if n >= READY_NUMBERS {
        return HeaderValue::from(n);
    }
    READY.get_or_init(|| {
        (0..READY_NUMBERS)
            .map(|i| {
                let text: &'static str = Box::leak(i.to_string().into_boxed_str());
                HeaderValue::from_static(text)
            })
            .collect()
    })[n as usize]
        .clone()
}

/// The three header names of `unit`, made once per thread and unit.
fn unit_names(unit: &str) -> Option<[HeaderName; 3]> {
    UNIT_NAMES.with_borrow_mut(|names| {
        if let Some((_, n)) = names.iter().find(|(u, _)| u == unit) {
            return Some(n.clone());
        }
        let made = unit_header_names(unit)?;
        // Units come from the policy: a handful. A reload may bring others.
        if names.len() >= 32 {
            names.clear();
        }
        names.push((unit.to_owned(), made.clone()));
        Some(made)
    })
}

fn put(h: &mut HeaderMap, name: HeaderName, value: &str) {
    if let Ok(v) = HeaderValue::from_str(value) {
        h.insert(name, v);
    }
}

/// A single-limit `RateLimit` value and what it shows: the limit's name,
/// `r` and `t`.
type RateLimitMemo = (Arc<str>, u64, u64, HeaderValue);

/// One enforced limit as `RateLimit-Policy` shows it: name, unit, quota
/// and window.
type PolicyPart = (Arc<str>, Arc<str>, u64, u64);

thread_local! {
    /// The last `RateLimit-Policy` value this thread built, by its text: a
    /// tier's policy rarely changes, so most responses share one value
    /// (a reference count, not a copy).
    static POLICY: RefCell<Option<(String, HeaderValue)>> = const { RefCell::new(None) };
    /// The last `X-RateLimit-Limit` value, by quota.
    static QUOTA: RefCell<Option<(u64, HeaderValue)>> = const { RefCell::new(None) };
    /// The last `X-RateLimit-Remaining` value above the ready numbers.
    static REMAINING: RefCell<Option<(u64, HeaderValue)>> = const { RefCell::new(None) };
    /// The last single-limit `RateLimit` value, by its limit's name, `r`
    /// and `t`.
    static RATELIMIT_MEMO: RefCell<Option<RateLimitMemo>> = const { RefCell::new(None) };
    /// What the last `RateLimit-Policy` value (in `POLICY`) was built
    /// from: each enforced limit's name, unit, quota and window.
    static POLICY_OF: RefCell<Vec<PolicyPart>> = const { RefCell::new(Vec::new()) };
    /// The last `X-RateLimit-Reset` value, by epoch second.
    static RESET: RefCell<Option<(u64, HeaderValue)>> = const { RefCell::new(None) };
    /// The buffer header values are written into.
    static SCRATCH: RefCell<String> = const { RefCell::new(String::new()) };
    /// The per-unit header names of the units seen.
    static UNIT_NAMES: RefCell<Vec<(String, [HeaderName; 3])>> = const { RefCell::new(Vec::new()) };
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

/// Whether two names are one text: the same allocation (a compiled
/// limit's name, shared by its reports) or equal characters. The memo
/// holds its `Arc`, so its address cannot be reused by another name.
fn same_text(a: &Arc<str>, b: &Arc<str>) -> bool {
    Arc::ptr_eq(a, b) || **a == **b
}

fn insert_policy(h: &mut HeaderMap, d: &Decision, buf: &mut String) {
    // The policy value changes only with the decision's limits: when they
    // are the ones the last value was built from, it is reused without
    // formatting anything.
    let same = POLICY_OF.with_borrow(|of| {
        let mut enforced = d.limits.iter().filter(|l| !l.shadow);
        !of.is_empty()
            && of.iter().all(|(name, unit, q, w)| {
                enforced.next().is_some_and(|l| {
                    l.quota == *q
                        && l.window_secs == *w
                        && same_text(name, &l.name)
                        && same_text(unit, &l.unit)
                })
            })
            && enforced.next().is_none()
    });
    if same {
        if let Some(v) = POLICY.with_borrow(|m| m.as_ref().map(|(_, v)| v.clone())) {
            h.insert(RATELIMIT_POLICY, v);
            return;
        }
    }
    buf.clear();
    for l in d.limits.iter().filter(|l| !l.shadow) {
        if !buf.is_empty() {
            buf.push_str(", ");
        }
        push_sf_string(buf, &l.name);
        buf.push_str(";q=");
        push_u64(buf, l.quota);
        buf.push_str(";w=");
        push_u64(buf, l.window_secs);
        if l.unit.as_ref() != REQUESTS {
            buf.push_str(";qu=");
            push_sf_string(buf, &l.unit);
        }
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
        POLICY_OF.with_borrow_mut(|of| {
            of.clear();
            of.extend(
                d.limits
                    .iter()
                    .filter(|l| !l.shadow)
                    .map(|l| (l.name.clone(), l.unit.clone(), l.quota, l.window_secs)),
            );
        });
        h.insert(RATELIMIT_POLICY, v);
    }
}

/// Appends a `RateLimit` member's parameters: `;r=<remaining>;t=<secs>`.
fn push_member_state(out: &mut String, remaining: u64, secs: u64) {
    out.push_str(";r=");
    push_u64(out, remaining);
    out.push_str(";t=");
    push_u64(out, secs);
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

    fn decision(limits: &[(&str, &str, u64, u64, f64)]) -> Decision {
        Decision {
            allowed: true,
            tier: "free".into(),
            limits: limits
                .iter()
                .map(|&(name, unit, quota, window_secs, left)| LimitReport {
                    name: name.into(),
                    unit: unit.into(),
                    quota,
                    window_secs,
                    remaining: Some(left),
                    reset_after: Duration::from_secs(1),
                    retry_after: Duration::ZERO,
                    allowed: true,
                    shadow: false,
                    exceeds_quota: false,
                })
                .collect(),
            retry_after: None,
            delay: Duration::ZERO,
            source: crate::Source::Store {
                shard: "memory".into(),
            },
            outcome: crate::telemetry::Outcome::Allowed,
            store_rtt: None,
            decided_at: 1_700_000_000_000_000,
            path: crate::DecisionPath::Store,
            route: None,
            method: None,
            slot: None,
        }
    }

    fn shown(d: &Decision) -> Vec<(String, String)> {
        let mut h = HeaderMap::new();
        insert(&mut h, d);
        let mut out: Vec<(String, String)> = h
            .iter()
            .map(|(n, v)| (n.to_string(), v.to_str().unwrap().to_owned()))
            .collect();
        out.sort();
        out
    }

    fn value(d: &Decision, name: &str) -> String {
        shown(d)
            .into_iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v)
            .unwrap_or_default()
    }

    #[test]
    fn values_kept_per_thread_follow_every_change_of_the_limits() {
        let a = decision(&[("burst", "requests", 5000, 1, 4000.0)]);
        let same_text = decision(&[("burst", "requests", 5000, 1, 4000.0)]);
        let other_quota = decision(&[("burst", "requests", 6000, 1, 4000.0)]);
        let other_window = decision(&[("burst", "requests", 5000, 2, 4000.0)]);
        let other_name = decision(&[("day", "requests", 5000, 1, 4000.0)]);
        let other_left = decision(&[("burst", "requests", 5000, 1, 3999.0)]);
        let two = decision(&[
            ("burst", "requests", 5000, 1, 4000.0),
            ("day", "requests", 9000, 86_400, 8000.0),
        ]);
        for _ in 0..2 {
            assert_eq!(value(&a, "ratelimit-policy"), "\"burst\";q=5000;w=1");
            assert_eq!(
                value(&same_text, "ratelimit-policy"),
                "\"burst\";q=5000;w=1"
            );
            assert_eq!(
                value(&other_quota, "ratelimit-policy"),
                "\"burst\";q=6000;w=1"
            );
            assert_eq!(
                value(&other_window, "ratelimit-policy"),
                "\"burst\";q=5000;w=2"
            );
            assert_eq!(value(&other_name, "ratelimit-policy"), "\"day\";q=5000;w=1");
            assert_eq!(
                value(&two, "ratelimit-policy"),
                "\"burst\";q=5000;w=1, \"day\";q=9000;w=86400"
            );
            assert_eq!(value(&a, "ratelimit"), "\"burst\";r=4000;t=1");
            assert_eq!(value(&a, "x-ratelimit-remaining"), "4000");
            assert_eq!(value(&other_name, "ratelimit"), "\"day\";r=4000;t=1");
            assert_eq!(value(&other_left, "ratelimit"), "\"burst\";r=3999;t=1");
            assert_eq!(value(&other_left, "x-ratelimit-remaining"), "3999");
            assert_eq!(value(&two, "ratelimit"), "\"burst\";r=4000;t=1");
        }
        assert_eq!(shown(&a), shown(&same_text));
    }

    #[test]
    fn seconds_round_up() {
        assert_eq!(ceil_secs(Duration::from_micros(1)), 1);
        assert_eq!(ceil_secs(Duration::from_secs(2)), 2);
        assert_eq!(ceil_secs(Duration::from_millis(2001)), 3);
    }
}
