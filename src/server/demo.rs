//! The demo API and the built-in traffic of `ratewatch demo`.

use std::net::SocketAddr;
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

/// One simulated client: its key (`None`: anonymous), how many requests it
/// sends a minute, and the addresses it sends them from, in turn.
struct Caller {
    key: Option<&'static str>,
    per_minute: u64,
    addrs: Vec<SocketAddr>,
}

impl Caller {
    fn new(key: Option<&'static str>, per_minute: u64, addrs: Vec<SocketAddr>) -> Self {
        Self {
            key,
            per_minute,
            addrs,
        }
    }
}

/// An address in the documentation ranges (RFC 5737), so the demo's clients
/// never look like real hosts.
fn addr(net: [u8; 3], host: u8) -> SocketAddr {
    SocketAddr::from(([net[0], net[1], net[2], host], 40_000 + u16::from(host)))
}

/// The demo fleet. Each client calls from its own address, as a real one
/// does, so the per-address ceilings (`scope = "ip"`) see one client each
/// and the blocks come from the keys' own limits. Rates are in requests a
/// minute; a request costs 11/7 units on average (every seventh is an
/// export of cost 5):
/// - free users at 12/min (about 0.31 units/s, under the 0.33/s refill;
///   their daily 1000 units last about 53 minutes, then `day` blocks them);
/// - one abusive free key at 1200/min from one address: blocked by its
///   own `burst` (and `minute`), long before its address's `ip_minute`,
///   which counts admitted requests only;
/// - a pro key bursting above its 10/s refill, and a calm pro key;
/// - an enterprise backend spread over 16 egress addresses (about 2 units/s
///   each, so its `ip_day` ceiling of 200,000 outlasts a day);
/// - anonymous visitors at 30/min each (under 60/min per address).
fn fleet() -> Vec<Caller> {
    const FREE: [u8; 3] = [198, 51, 100];
    const PAID: [u8; 3] = [203, 0, 113];
    const ANON: [u8; 3] = [192, 0, 2];
    let free_users = [
        "free_demo_alice_0001",
        "free_demo_bob_00002",
        "free_demo_chen_0003",
        "free_demo_dara_0004",
        "free_demo_emeka_005",
        "free_demo_fatima_06",
    ];
    let mut fleet: Vec<Caller> = free_users
        .iter()
        .zip(10u8..)
        .map(|(key, host)| Caller::new(Some(key), 12, vec![addr(FREE, host)]))
        .collect();
    fleet.push(Caller::new(
        Some("free_demo_abuser_666"),
        1_200,
        vec![addr(FREE, 66)],
    ));
    fleet.push(Caller::new(
        Some("pro_demo_carol_00003"),
        720,
        vec![addr(PAID, 10), addr(PAID, 11)],
    ));
    fleet.push(Caller::new(
        Some("pro_demo_gus_000007"),
        180,
        vec![addr(PAID, 12)],
    ));
    fleet.push(Caller::new(
        Some("ent_demo_dave_000004"),
        1_200,
        (100..116).map(|h| addr(PAID, h)).collect(),
    ));
    for host in 20..24 {
        fleet.push(Caller::new(None, 30, vec![addr(ANON, host)]));
    }
    fleet
}

/// Sends built-in traffic through `app` (in process, no socket) until the
/// returned handle is aborted: a built-in fleet of clients, each request
/// carrying its client's address as the peer address (a plain
/// `SocketAddr` in the request's extensions, where the layer looks when
/// there is no socket), so the dashboard and metrics fill as a real fleet's
/// would.
pub fn spawn_demo_traffic(app: axum::Router) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let callers = fleet();
        let mut sent = vec![0u64; callers.len()];
        let mut tick: u64 = 0;
        loop {
            for (caller, sent) in callers.iter().zip(sent.iter_mut()) {
                // Four ticks a second: send what is due by the end of this
                // tick, so fractional rates even out over the minute.
                let due = (tick + 1) * caller.per_minute / 240;
                while *sent < due {
                    let n = *sent;
                    *sent += 1;
                    let (method, path) = match n % 7 {
                        0 => ("POST", "/api/export"),
                        1 | 2 => ("POST", "/api/data"),
                        _ => ("GET", "/api/users"),
                    };
                    let mut req = Request::builder().method(method).uri(path);
                    if let Some(k) = caller.key {
                        req = req.header("x-api-key", k);
                    }
                    let Ok(mut req) = req.body(Body::empty()) else {
                        continue;
                    };
                    let peer = caller.addrs[(n as usize) % caller.addrs.len()];
                    req.extensions_mut().insert(peer);
                    let _ = app.clone().oneshot(req).await;
                }
            }
            tick += 1;
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    })
}
