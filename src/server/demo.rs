//! The demo API and the built-in traffic of `ratewatch demo`.

use std::time::Duration;

use axum::Json;
use axum::body::Body;
use http::Request;
use serde_json::{Value, json};
use tower::ServiceExt;

pub(super) async fn users() -> Json<Value> {
    Json(json!({ "users": [{ "id": 1, "name": "ada" }, { "id": 2, "name": "grace" }] }))
}

pub(super) async fn data(body: axum::body::Bytes) -> Json<Value> {
    Json(json!({ "stored_bytes": body.len() }))
}

pub(super) async fn export() -> Json<Value> {
    Json(json!({ "export": "queued" }))
}

/// Sends built-in traffic through `app` (in process, no socket) until the
/// returned handle is aborted: a few well-behaved keys per tier, one abusive
/// free key, and anonymous callers, so the dashboard and metrics fill.
pub fn spawn_demo_traffic(app: axum::Router) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        // (key, requests per second): well-behaved callers stay under their
        // tier's refill, the abuser does not, and a pro key bursts above 10/s.
        let callers: Vec<(Option<String>, u32)> = vec![
            (Some("free_demo_alice_0001".into()), 1),
            (Some("free_demo_bob_00002".into()), 1),
            (Some("free_demo_abuser_666".into()), 20),
            (Some("pro_demo_carol_00003".into()), 12),
            (Some("ent_demo_dave_000004".into()), 40),
            (None, 2),
        ];
        let mut tick: u64 = 0;
        loop {
            for (key, per_second) in &callers {
                // Four ticks a second: spread each caller's rate over them.
                let per_tick = per_second / 4 + u32::from(tick % 4 < u64::from(per_second % 4));
                for i in 0..per_tick {
                    let (method, path) = match (tick + i as u64) % 7 {
                        0 => ("POST", "/api/export"),
                        1 | 2 => ("POST", "/api/data"),
                        _ => ("GET", "/api/users"),
                    };
                    let mut req = Request::builder().method(method).uri(path);
                    if let Some(k) = key {
                        req = req.header("x-api-key", k);
                    }
                    if let Ok(req) = req.body(Body::empty()) {
                        let _ = app.clone().oneshot(req).await;
                    }
                }
            }
            tick += 1;
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    })
}
