//! The limiter's own answers: 429, 503, 400, 401. [`Refusal`] says what was
//! refused; its default response is a small JSON body saying what happened
//! and when to retry, and an app may answer with its own instead
//! ([`RateLimitLayer::with_refusal`](super::RateLimitLayer::with_refusal)).

use std::time::Duration;

use axum::response::Response;
use bytes::Bytes;
use http::{HeaderValue, StatusCode, header};
use serde::Serialize;

use super::headers::{self, HeaderFamilies, ceil_secs};
use crate::identity::IdentityError;
use crate::policy::FailurePolicy;
use crate::{Decision, Source};

/// A request the limiter answers itself instead of passing it on.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub enum Refusal<'a> {
    /// A limit blocked the request: 429.
    RateLimited {
        /// The decision; [`Decision::most_constraining`] names the limit.
        decision: &'a Decision,
        /// Whole seconds until the request would pass (jitter included);
        /// 0 when it never would: its cost exceeds a limit's quota
        /// ([`Decision::exceeded_quota`]), and no `Retry-After` is sent.
        retry_after_secs: u64,
    },
    /// The store could not decide and the route fails closed: 503.
    Unavailable {
        /// The fallback decision.
        decision: &'a Decision,
        /// Whole seconds until the limiter tries the store again.
        retry_after_secs: u64,
    },
    /// The request has no usable identity: 400 for a malformed or too long
    /// header or two different credentials, 403 for a tier the policy does
    /// not define ([`IdentityError::status`]).
    BadIdentity(&'a IdentityError),
    /// No key, and anonymous callers are rejected: 401.
    Unauthorized(&'a IdentityError),
}

impl<'a> Refusal<'a> {
    /// The refusal of a decision that did not allow: 503 when the route
    /// failed closed, else 429. `jitter` is the most `Retry-After` may be
    /// pushed back, so refused clients do not all return at once.
    pub(crate) fn of_decision(d: &'a Decision, jitter: Duration) -> Self {
        if d.exceeded_quota().is_some() && !d.is_fallback() {
            // Waiting would not help: no retry time rather than one that lies.
            return Refusal::RateLimited {
                decision: d,
                retry_after_secs: 0,
            };
        }
        let retry = d.retry_after.unwrap_or(Duration::from_secs(1));
        let jitter = if jitter.is_zero() {
            Duration::ZERO
        } else {
            Duration::from_micros(rand::random_range(0..=jitter.as_micros() as u64))
        };
        let retry_after_secs = ceil_secs(retry + jitter).max(1);
        let closed = matches!(
            d.source,
            Source::Fallback {
                policy: FailurePolicy::Closed,
                ..
            }
        );
        if closed {
            Refusal::Unavailable {
                decision: d,
                retry_after_secs,
            }
        } else {
            Refusal::RateLimited {
                decision: d,
                retry_after_secs,
            }
        }
    }

    /// The refusal of a request without a usable identity.
    pub(crate) fn of_identity(e: &'a IdentityError) -> Self {
        if e.status() == StatusCode::UNAUTHORIZED {
            Refusal::Unauthorized(e)
        } else {
            Refusal::BadIdentity(e)
        }
    }

    /// The status of the default answer.
    pub fn status(&self) -> StatusCode {
        match self {
            Refusal::RateLimited { .. } => StatusCode::TOO_MANY_REQUESTS,
            Refusal::Unavailable { .. } => StatusCode::SERVICE_UNAVAILABLE,
            Refusal::BadIdentity(e) | Refusal::Unauthorized(e) => e.status(),
        }
    }

    /// The decision behind a 429 or 503.
    pub fn decision(&self) -> Option<&'a Decision> {
        match *self {
            Refusal::RateLimited { decision, .. } | Refusal::Unavailable { decision, .. } => {
                Some(decision)
            }
            Refusal::BadIdentity(_) | Refusal::Unauthorized(_) => None,
        }
    }

    /// Whole seconds to wait before retrying (429 and 503 only).
    pub fn retry_after_secs(&self) -> Option<u64> {
        match *self {
            Refusal::RateLimited {
                retry_after_secs, ..
            }
            | Refusal::Unavailable {
                retry_after_secs, ..
            } => Some(retry_after_secs),
            Refusal::BadIdentity(_) | Refusal::Unauthorized(_) => None,
        }
    }

    /// What happened, in a sentence (the JSON body's `message`, a gRPC
    /// refusal's `grpc-message`).
    pub fn message(&self) -> String {
        match *self {
            Refusal::RateLimited { decision, .. } if decision.exceeded_quota().is_some() => {
                let l = decision.exceeded_quota().expect("checked");
                format!(
                    "the request costs more than the quota ({}) of limit \"{}\" of tier \"{}\"; it can never pass",
                    l.quota, l.name, decision.tier
                )
            }
            Refusal::RateLimited {
                decision,
                retry_after_secs,
            } => format!(
                "limit \"{}\" of tier \"{}\" exceeded; retry in {retry_after_secs} s",
                decision.most_constraining().map_or("?", |l| &*l.name),
                decision.tier
            ),
            Refusal::Unavailable {
                retry_after_secs, ..
            } => format!(
                "the rate limiter cannot decide right now and this route fails closed; retry in {retry_after_secs} s"
            ),
            Refusal::BadIdentity(e) | Refusal::Unauthorized(e) => e.to_string(),
        }
    }

    /// ratewatch's own answer: the status and a JSON body naming the tier,
    /// the limit and when to retry (the layer adds the headers).
    pub fn default_response(&self) -> Response {
        self.default_parts().map(axum::body::Body::from)
    }

    /// [`Refusal::default_response`] with its body as bytes.
    pub(crate) fn default_parts(&self) -> http::Response<Bytes> {
        let message = self.message();
        let json = match *self {
            Refusal::RateLimited {
                decision,
                retry_after_secs,
            } => {
                let refused_by = decision
                    .exceeded_quota()
                    .or_else(|| decision.most_constraining());
                serde_json::to_vec(&Body {
                    error: if decision.exceeded_quota().is_some() {
                        "cost_exceeds_quota"
                    } else {
                        "rate_limited"
                    },
                    message,
                    tier: &decision.tier,
                    limit: refused_by.map(|l| &*l.name),
                    unit: refused_by.map(|l| &*l.unit),
                    retry_after_seconds: retry_after_secs,
                })
            }
            Refusal::Unavailable {
                decision,
                retry_after_secs,
            } => serde_json::to_vec(&Body {
                error: "rate_limiter_unavailable",
                message,
                tier: &decision.tier,
                limit: None,
                unit: None,
                retry_after_seconds: retry_after_secs,
            }),
            Refusal::BadIdentity(e) | Refusal::Unauthorized(e) => {
                serde_json::to_vec(&BadIdentity {
                    error: e.code(),
                    message,
                })
            }
        };
        let mut res = http::Response::new(Bytes::from(json.unwrap_or_default()));
        *res.status_mut() = self.status();
        res.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        res
    }

    /// Adds what every refusal carries, whoever built the response: the
    /// rate-limit headers of `families`, `Retry-After` on a 429 or 503 and
    /// `WWW-Authenticate` on a 401, each only where the response has not
    /// set it itself.
    pub(crate) fn finish<B>(
        &self,
        mut res: http::Response<B>,
        families: HeaderFamilies,
    ) -> http::Response<B> {
        let h = res.headers_mut();
        if let Some(d) = self.decision() {
            let mut ours = http::HeaderMap::new();
            headers::insert_families(&mut ours, d, families);
            for (name, value) in ours {
                if let Some(name) = name {
                    h.entry(name).or_insert(value);
                }
            }
        }
        // 0: the request can never pass (its cost exceeds a quota).
        if let (Some(secs @ 1..), true) = (self.retry_after_secs(), families.retry_after) {
            h.entry(header::RETRY_AFTER)
                .or_insert_with(|| HeaderValue::from(secs));
        }
        if matches!(self, Refusal::Unauthorized(_)) {
            h.entry(header::WWW_AUTHENTICATE)
                .or_insert(HeaderValue::from_static("Bearer"));
        }
        res
    }
}

#[derive(Serialize)]
struct Body<'a> {
    error: &'static str,
    message: String,
    tier: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    limit: Option<&'a str>,
    /// The unit the refusing limit counts.
    #[serde(skip_serializing_if = "Option::is_none")]
    unit: Option<&'a str>,
    retry_after_seconds: u64,
}

#[derive(Serialize)]
struct BadIdentity {
    error: &'static str,
    message: String,
}

/// ratewatch's answer to a request without a usable identity: 400 for a
/// malformed value, 401 (with `WWW-Authenticate`) where keys are required.
pub(crate) fn identity_error(e: &IdentityError) -> Response {
    let refusal = Refusal::of_identity(e);
    refusal.finish(refusal.default_response(), HeaderFamilies::ALL)
}
