//! The HTTP front end on the `--listen` port: `POST /json` and
//! `POST /v1/decide` (and the route of `POST /v1/settle`, whose handler is
//! `settle.rs`).
//!
//! Both answer callers on this host only ([`local_caller`]), unless
//! `[rls] token` is set: then every caller, loopback or not, must send
//! `Authorization: Bearer <token>` (compared in constant time). A trusted
//! proxy's `X-Forwarded-For` names the client, as for the dashboard; a
//! loopback peer outside `trusted_proxies` that forwards for someone else
//! is refused.
//!
//! `POST /json` takes a `RateLimitRequest` as proto3 JSON and answers the
//! `RateLimitResponse` as proto3 JSON: 200 when OK, 429 when OVER_LIMIT,
//! 503 when the store is unreachable under `on_store_failure =
//! "unavailable"`, 400 for a malformed request.
//!
//! `POST /v1/decide` takes ratewatch's own request (see the README,
//! "Decision service API") and answers with the same rate-limit headers as
//! the middleware. A key decision may name its cost per unit (`"costs":
//! {"tokens": N}`) and hold what it charged (`"reserve": true`): the
//! answer then names a reservation that `POST /v1/settle` settles with
//! what the request really used (a reservation lives in the process
//! that made it).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{FromRef, Request, State};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use http::{HeaderMap, StatusCode, header};
use serde::Deserialize;
use serde_json::json;

use super::decide::{RateLimitService, RlsError};
use super::json::{request_from_json, response_to_json};
use super::request::{RlsDescriptor, RlsRequest};
use super::reservations::{self, Reservations};
use crate::identity::{Identity, IdentityKind, peer_ip};
use crate::layer::headers;
use crate::layer::local_caller;
use crate::limiter::group_decision;
use crate::telemetry::rls as m;
use crate::{Costs, Decision};

/// Largest request body read (a RateLimitRequest is small).
const MAX_BODY: usize = 64 * 1024;

/// Most units one request names in `costs` or `used`.
pub(super) const MAX_UNITS: usize = 16;

/// `POST /json`, `POST /v1/decide` and `POST /v1/settle`, for any router
/// state. The reservations of `/v1/decide` are held by these routes, in
/// this process.
pub fn routes<S: Clone + Send + Sync + 'static>(service: RateLimitService) -> Router<S> {
    let state = HttpState {
        service,
        reservations: Arc::new(Reservations::new(reservations::MAX_HELD)),
    };
    Router::new()
        .route("/json", post(json_handler))
        .route("/v1/decide", post(decide_handler))
        .route("/v1/settle", post(super::settle::settle_handler))
        .route(
            "/rlconfig",
            axum::routing::get(
                |State(s): State<RateLimitService>, req: Request| async move {
                    refuse(&s, &req, "rlconfig").unwrap_or_else(|| super::rlconfig::dump(&s))
                },
            ),
        )
        .with_state(state)
}

/// The routes' state: the service and the reservations it holds.
#[derive(Clone)]
pub(super) struct HttpState {
    pub(super) service: RateLimitService,
    pub(super) reservations: Arc<Reservations>,
}

impl FromRef<HttpState> for RateLimitService {
    fn from_ref(state: &HttpState) -> Self {
        state.service.clone()
    }
}

/// `None` admits the caller; otherwise the refusal.
pub(super) fn refuse(
    service: &RateLimitService,
    req: &Request,
    api: &'static str,
) -> Option<Response> {
    let policy = service.limiter().policy();
    let bad = |status: StatusCode, why: &'static str| {
        m::record_error(api, "unauthorized");
        Some((status, Json(json!({"error": why}))).into_response())
    };
    if let Some(token) = &policy.rls.token {
        let given = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split_once(' '))
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            .map(|(_, t)| t.trim());
        return match given {
            Some(t) if constant_time_eq(t.as_bytes(), token.as_bytes()) => None,
            _ => bad(
                StatusCode::UNAUTHORIZED,
                "this endpoint requires Authorization: Bearer <[rls] token>",
            ),
        };
    }
    let peer = peer_ip(req.extensions());
    match local_caller(&policy.identity.trusted_proxies, req.headers(), peer) {
        Ok(()) => None,
        Err(why) => {
            m::record_error(api, "unauthorized");
            let message = format!(
                "this endpoint answers callers on this host only unless [rls] token is set: {}",
                why.reason()
            );
            Some((StatusCode::FORBIDDEN, Json(json!({"error": message}))).into_response())
        }
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// `serde_json` output as a response, without axum's `json` feature type.
pub(super) struct Json(pub(super) serde_json::Value);

impl IntoResponse for Json {
    fn into_response(self) -> Response {
        (
            [(header::CONTENT_TYPE, "application/json")],
            self.0.to_string(),
        )
            .into_response()
    }
}

pub(super) async fn body_of(req: Request, api: &'static str) -> Result<Bytes, Response> {
    axum::body::to_bytes(req.into_body(), MAX_BODY)
        .await
        .map_err(|_| bad_request(api, "the body is unreadable or larger than 64 KiB"))
}

pub(super) fn bad_request(api: &'static str, why: impl std::fmt::Display) -> Response {
    m::record_error(api, "bad_request");
    (
        StatusCode::BAD_REQUEST,
        Json(json!({"error": why.to_string()})),
    )
        .into_response()
}

fn unavailable(e: &RlsError) -> Response {
    (
        StatusCode::SERVICE_UNAVAILABLE,
        [(header::RETRY_AFTER, "1")],
        Json(json!({"error": "store_unavailable", "message": e.to_string()})),
    )
        .into_response()
}

async fn json_handler(State(service): State<RateLimitService>, req: Request) -> Response {
    if let Some(r) = refuse(&service, &req, "json") {
        return r;
    }
    let body = match body_of(req, "json").await {
        Ok(b) => b,
        Err(r) => return r,
    };
    let request = match request_from_json(&body) {
        Ok(r) => r,
        Err(e) => return bad_request("json", e),
    };
    if let Err(e) = request.check_size() {
        return bad_request("json", format!("invalid RateLimitRequest: {e}"));
    }
    if let Err(e) = request.check_required() {
        return bad_request("json", e);
    }
    match service.decide(&request, "json").await {
        Ok(answer) => {
            let status = if answer.over_limit {
                StatusCode::TOO_MANY_REQUESTS
            } else {
                StatusCode::OK
            };
            (status, Json(response_to_json(&answer))).into_response()
        }
        Err(e) => unavailable(&e),
    }
}

/// The body of `POST /v1/decide`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DecideRequest {
    /// An API key: its tier comes from the policy's key prefixes.
    key: Option<String>,
    /// Any other caller identity (a user id...): the default tier.
    identity: Option<String>,
    tier: Option<String>,
    route: Option<String>,
    method: Option<String>,
    domain: Option<String>,
    descriptors: Option<Vec<DescriptorInput>>,
    cost: Option<u64>,
    /// The request's cost per unit (`requests` is `cost`'s unit).
    costs: Option<BTreeMap<String, u64>>,
    #[serde(default)]
    peek: bool,
    /// Hold what an admitted decision charged, to settle it later.
    #[serde(default)]
    reserve: bool,
    /// How long the reservation is held (default 60 s, at most 600 s).
    hold_ms: Option<u64>,
}

/// A descriptor as `{"key": "value", ...}` (entries in key order is not
/// guaranteed by JSON objects, so a list of pairs is accepted too).
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum DescriptorInput {
    Entries(Vec<EntryInput>),
    Pairs(serde_json::Map<String, serde_json::Value>),
}

#[derive(Debug, Deserialize)]
struct EntryInput {
    key: String,
    value: String,
}

async fn decide_handler(State(state): State<HttpState>, req: Request) -> Response {
    let service = &state.service;
    if let Some(r) = refuse(service, &req, "decide") {
        return r;
    }
    let (parts, body) = req.into_parts();
    let body = match body_of(Request::from_parts(parts.clone(), body), "decide").await {
        Ok(b) => b,
        Err(r) => return r,
    };
    let input: DecideRequest = match serde_json::from_slice(&body) {
        Ok(i) => i,
        Err(e) => return bad_request("decide", e),
    };
    let started = Instant::now();
    let answer = if input.domain.is_some() || input.descriptors.is_some() {
        decide_descriptors(service, input).await
    } else {
        decide_key(service, &state.reservations, input, &parts).await
    };
    if answer.status() != StatusCode::BAD_REQUEST {
        m::record_latency("decide", started.elapsed());
    }
    answer
}

async fn decide_descriptors(service: &RateLimitService, input: DecideRequest) -> Response {
    if input.key.is_some() || input.identity.is_some() || input.route.is_some() {
        return bad_request(
            "decide",
            "give either domain + descriptors, or key/identity with route",
        );
    }
    if input.costs.is_some() || input.reserve || input.hold_ms.is_some() {
        return bad_request(
            "decide",
            "costs, reserve and hold_ms apply to a key or identity, not to descriptors",
        );
    }
    let Some(domain) = input.domain else {
        return bad_request("decide", "descriptors need a domain");
    };
    let mut descriptors = Vec::new();
    for d in input.descriptors.unwrap_or_default() {
        let entries = match d {
            DescriptorInput::Entries(e) => e.into_iter().map(|e| (e.key, e.value)).collect(),
            DescriptorInput::Pairs(map) => {
                let mut entries = Vec::new();
                for (k, v) in map {
                    match v {
                        serde_json::Value::String(s) => entries.push((k, s)),
                        _ => return bad_request("decide", "descriptor values must be strings"),
                    }
                }
                entries
            }
        };
        descriptors.push(RlsDescriptor {
            entries,
            limit: None,
            hits_addend: input.cost,
        });
    }
    let request = RlsRequest {
        domain,
        descriptors,
        hits_addend: 0,
    };
    if let Err(e) = request.check_size() {
        return bad_request("decide", e);
    }
    match service
        .decide_with_groups(&request, input.peek, "decide")
        .await
    {
        Ok((answer, groups)) => {
            let decision = group_decision(&groups, request.domain.as_str().into());
            let body = json!({
                "allowed": !answer.over_limit,
                "domain": request.domain,
                "statuses": response_to_json(&answer)["statuses"].clone(),
                "retry_after_secs": decision.retry_after.map(headers::ceil_secs),
            });
            with_headers(&decision, !answer.over_limit, body)
        }
        Err(e) => unavailable(&e),
    }
}

async fn decide_key(
    service: &RateLimitService,
    reservations: &Reservations,
    input: DecideRequest,
    parts: &http::request::Parts,
) -> Response {
    let hold = match hold_of(&input) {
        Ok(h) => h,
        Err(why) => return bad_request("decide", why),
    };
    let costs = match costs_of(input.cost, input.costs) {
        Ok(c) => c,
        Err(why) => return bad_request("decide", why),
    };
    let identity = match (input.key, input.identity) {
        (Some(k), None) => Identity::new(IdentityKind::ApiKey, k),
        (None, Some(i)) => Identity::new(IdentityKind::Custom, i),
        _ => {
            return bad_request(
                "decide",
                "give exactly one of key and identity (or domain + descriptors)",
            );
        }
    };
    let snapshot = service.limiter().snapshot();
    let (identity, tier) = match input.tier {
        Some(t) if snapshot.policy().tiers.iter().any(|x| x.name == t) => (identity, t),
        Some(t) => return bad_request("decide", format!("unknown tier {t:?}")),
        // A key is judged as the middleware judges a header's: a key that
        // names no tier follows `[identity] unmatched_keys` (the shared
        // anonymous caller, or refused with the middleware's 401).
        None if identity.kind() == IdentityKind::ApiKey => {
            match snapshot.caller_of(identity, parts) {
                Ok(c) => (c.identity, c.tier),
                Err(e) => {
                    m::record_error("decide", "unauthorized");
                    return (
                        e.status(),
                        Json(json!({"error": "unauthorized", "message": e.to_string()})),
                    )
                        .into_response();
                }
            }
        }
        None => (identity, snapshot.policy().identity.default_tier.clone()),
    };
    let route = input
        .route
        .as_deref()
        .and_then(|path| snapshot.route_for(input.method.as_deref().unwrap_or("GET"), path));
    if snapshot.is_exempt(route.as_ref()) {
        return (
            StatusCode::OK,
            Json(json!({"allowed": true, "exempt": true, "tier": tier})),
        )
            .into_response();
    }
    // The slot is claimed before the decision: a full table charges
    // nothing.
    let claim = match input.reserve.then(|| reservations.claim()).transpose() {
        Ok(c) => c,
        Err(full) => {
            m::record_error("decide", "store_unavailable");
            return (
                StatusCode::SERVICE_UNAVAILABLE,
                [(header::RETRY_AFTER, "1")],
                Json(json!({"error": "reservations_full", "message": full.to_string()})),
            )
                .into_response();
        }
    };
    let (decision, reservation) = if input.peek {
        (snapshot.peek(&identity, &tier, route.as_ref()).await, None)
    } else if claim.is_some() {
        snapshot
            .reserve_costs(&identity, &tier, route.as_ref(), costs.as_ref())
            .await
    } else if let Some(costs) = &costs {
        let d = snapshot
            .check_with_costs(&identity, &tier, route.as_ref(), costs)
            .await;
        (d, None)
    } else {
        (snapshot.check(&identity, &tier, route.as_ref()).await, None)
    };
    let held = match (claim, reservation) {
        (Some(claim), Some(r)) => Some(claim.hold(r, hold)),
        _ => None,
    };
    let limits: Vec<serde_json::Value> = decision
        .limits
        .iter()
        .map(|l| {
            json!({
                "name": l.name.as_ref(),
                "unit": l.unit.as_ref(),
                "quota": l.quota,
                "window_secs": l.window_secs,
                "remaining": l.remaining.map(|r| r.max(0.0).floor() as u64),
                "reset_after_secs": headers::ceil_secs(l.reset_after),
                "allowed": l.allowed,
                "shadow": l.shadow,
            })
        })
        .collect();
    let mut body = json!({
        "allowed": decision.allowed,
        "tier": decision.tier.as_ref(),
        "limits": limits,
        "retry_after_secs": decision.retry_after.map(headers::ceil_secs),
        "fallback": decision.is_fallback(),
    });
    if input.reserve {
        // Null when nothing was charged: refused, or the failure policy
        // (or no limit) answered.
        body["reservation"] = json!(held.map(|id| id.to_string()));
        body["expires_in_ms"] = json!(held.map(|_| hold.as_millis() as u64));
    }
    let allowed = decision.allowed;
    with_headers(&decision, allowed, body)
}

/// The middleware's headers for `decision`, 200 or 429 (503 when the
/// store failed closed), `Retry-After` on refusals.
fn with_headers(decision: &Decision, allowed: bool, body: serde_json::Value) -> Response {
    let mut h = HeaderMap::new();
    headers::insert(&mut h, decision);
    let status = if allowed {
        StatusCode::OK
    } else if decision.is_fallback() && !decision.state_known() {
        StatusCode::SERVICE_UNAVAILABLE
    } else {
        StatusCode::TOO_MANY_REQUESTS
    };
    // A cost above a limit's quota never passes: no retry time that lies.
    if !allowed && decision.exceeded_quota().is_none() {
        let retry = decision.retry_after.unwrap_or(Duration::from_secs(1));
        h.insert(
            header::RETRY_AFTER,
            http::HeaderValue::from(headers::ceil_secs(retry).max(1)),
        );
    }
    (status, h, Json(body)).into_response()
}

/// The request's costs: `cost` in requests, `costs` per unit.
fn costs_of(
    cost: Option<u64>,
    costs: Option<BTreeMap<String, u64>>,
) -> Result<Option<Costs>, String> {
    let Some(units) = costs else {
        return Ok(cost.map(Costs::requests));
    };
    if units.len() > MAX_UNITS {
        return Err(format!("costs names more than {MAX_UNITS} units"));
    }
    if cost.is_some() && units.contains_key(crate::policy::REQUESTS) {
        return Err("give the requests cost once: as cost or as costs.requests".into());
    }
    let mut out: Costs = units.into_iter().collect();
    if let Some(n) = cost {
        out.set(crate::policy::REQUESTS, n);
    }
    Ok(Some(out))
}

/// How long a reservation of this request is held.
fn hold_of(input: &DecideRequest) -> Result<Duration, String> {
    let max = reservations::MAX_HOLD.as_millis() as u64;
    match input.hold_ms {
        None => Ok(reservations::DEFAULT_HOLD),
        Some(_) if !input.reserve => Err("hold_ms needs reserve: true".into()),
        Some(ms) if (1..=max).contains(&ms) => Ok(Duration::from_millis(ms)),
        Some(_) => Err(format!("hold_ms must be 1 to {max}")),
    }
    .and_then(|h| {
        if input.reserve && input.peek {
            Err("peek charges nothing: there is nothing to reserve".into())
        } else {
            Ok(h)
        }
    })
}
