//! `POST /v1/settle`: a reservation made by `POST /v1/decide` with
//! `"reserve": true`, settled with what the request used, per unit.
//!
//! Idempotent: the first settle runs in a task of its own (a client that
//! hangs up does not stop it) and a repeat waits for and answers its
//! outcome. A reservation lives in the process that made it; one that is
//! unknown here (never made, expired, or settled too long ago) is a 404.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use http::StatusCode;
use serde::Deserialize;
use serde_json::json;

use super::http::{HttpState, Json, MAX_UNITS, bad_request, body_of, refuse};
use super::reservations::{Lookup, Outcome, ReservationId};
use crate::Costs;
use crate::limiter::Settled;

/// The body of `POST /v1/settle`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SettleRequest {
    reservation: String,
    #[serde(default)]
    used: BTreeMap<String, u64>,
}

pub(super) async fn settle_handler(State(state): State<HttpState>, req: Request) -> Response {
    if let Some(r) = refuse(&state.service, &req, "decide") {
        return r;
    }
    let body = match body_of(req, "decide").await {
        Ok(b) => b,
        Err(r) => return r,
    };
    let input: SettleRequest = match serde_json::from_slice(&body) {
        Ok(i) => i,
        Err(e) => return bad_request("decide", e),
    };
    if input.used.len() > MAX_UNITS {
        return bad_request("decide", format!("used names more than {MAX_UNITS} units"));
    }
    let unknown = || {
        (
            StatusCode::NOT_FOUND,
            Json(json!({
                "error": "unknown_reservation",
                "message": "no reservation of this id is held here: never made, expired, or settled too long ago",
            })),
        )
            .into_response()
    };
    let Some(id) = ReservationId::parse(&input.reservation) else {
        return unknown();
    };
    let outcome = match state.reservations.take(id) {
        Lookup::Unknown => return unknown(),
        Lookup::Settle(reservation, tx) => {
            let used: Costs = input.used.into_iter().collect();
            // Settled in a task of its own: a client that hangs up does
            // not stop it, and a repeat settle waits for its outcome.
            let task = tokio::spawn(async move {
                let outcome: Outcome = Arc::new(reservation.settle_costs(&used).await);
                let _ = tx.send(Some(outcome.clone()));
                outcome
            });
            task.await.ok()
        }
        Lookup::Settled(mut rx) => rx
            .wait_for(Option::is_some)
            .await
            .ok()
            .and_then(|o| o.clone()),
    };
    let Some(outcome) = outcome else {
        return (
            StatusCode::INTERNAL_SERVER_ERROR,
            Json(json!({"error": "settle_failed", "message": "the settle did not finish"})),
        )
            .into_response();
    };
    let units: Vec<serde_json::Value> = outcome
        .iter()
        .map(|(unit, settled)| {
            let (outcome, units) = match settled {
                Settled::Exact => ("exact", 0),
                Settled::Charged(n) => ("charged", *n),
                Settled::Refunded(n) => ("refunded", *n),
                Settled::Failed => ("failed", 0),
                Settled::Stale => ("stale", 0),
            };
            json!({"unit": unit.as_ref(), "outcome": outcome, "units": units})
        })
        .collect();
    (
        StatusCode::OK,
        Json(json!({"reservation": id.to_string(), "settled": units})),
    )
        .into_response()
}
