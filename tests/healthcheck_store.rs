//! `[server] healthcheck_store = true`: `/healthcheck` and gRPC health
//! fail while the store is down (every shard's breaker open) and recover
//! with it, against a real redis-server killed and restarted; without the
//! key they answer as before whatever the store does.
#![cfg(feature = "server")]

mod support;

use std::time::{Duration, Instant};

use ratewatch::service::grpc::ProstCodec;
use ratewatch::service::proto::{HealthCheckRequest, HealthCheckResponse, ServingStatus};
use support::{Ratewatch, RedisServer, free_port, policy_file};
use tonic::transport::Channel;

/// The built-in demo policy on `url`, with `[server]` ending it.
fn policy(url: &str, server: &str) -> tempfile::NamedTempFile {
    let demo = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/ratewatch.toml"))
        .expect("the demo policy");
    let text = demo
        .replacen(
            "kind = \"memory\"",
            &format!("kind = \"redis\"\nurl = \"{url}\""),
            1,
        )
        .replacen(
            "breaker = { failures = 5, open_ms = 2000 }",
            "breaker = { failures = 3, open_ms = 300 }",
            1,
        );
    assert!(text.contains(url) && text.contains("open_ms = 300"));
    policy_file(&format!("{text}\n[server]\n{server}\n"))
}

/// `GET /healthcheck`: status and body.
async fn healthcheck(http: &reqwest::Client, rw: &Ratewatch) -> (u16, String) {
    match http.get(format!("{}/healthcheck", rw.url())).send().await {
        Ok(r) => (r.status().as_u16(), r.text().await.unwrap_or_default()),
        Err(e) => (0, e.to_string()),
    }
}

/// One request through the limiter (it calls the store).
async fn traffic(http: &reqwest::Client, rw: &Ratewatch) {
    let _ = http
        .get(format!("{}/api/users", rw.url()))
        .header("x-api-key", "free_health")
        .send()
        .await;
}

async fn channel(addr: &str) -> Channel {
    let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect_timeout(Duration::from_secs(5));
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match endpoint.connect().await {
            Ok(c) => return c,
            Err(e) => {
                assert!(Instant::now() < deadline, "no gRPC server at {addr}: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

async fn grpc_health(c: &Channel) -> i32 {
    let mut grpc = tonic::client::Grpc::new(c.clone());
    grpc.ready().await.expect("channel ready");
    grpc.unary(
        tonic::Request::new(HealthCheckRequest {
            service: String::new(),
        }),
        http::uri::PathAndQuery::from_static("/grpc.health.v1.Health/Check"),
        ProstCodec::<HealthCheckRequest, HealthCheckResponse>::default(),
    )
    .await
    .expect("health answers")
    .into_inner()
    .status
}

/// Sends traffic until `/healthcheck` answers `status`; fails after a
/// generous bound.
async fn until_healthcheck(http: &reqwest::Client, rw: &Ratewatch, status: u16) -> String {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        traffic(http, rw).await;
        let (s, body) = healthcheck(http, rw).await;
        if s == status {
            return body;
        }
        assert!(
            Instant::now() < deadline,
            "/healthcheck never answered {status} (last: {s} {body})"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Whether `/metrics` shows a store breaker open.
async fn breaker_open(http: &reqwest::Client, rw: &Ratewatch) -> bool {
    let Ok(r) = http.get(format!("{}/metrics", rw.url())).send().await else {
        return false;
    };
    r.text().await.unwrap_or_default().lines().any(|l| {
        l.starts_with("ratewatch_breaker_state{") && (l.ends_with(" 2") || l.ends_with(" 1"))
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthcheck_fails_while_the_store_is_down_and_recovers_with_it() {
    let mut redis = RedisServer::start();
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let on = policy(&redis.url(), "healthcheck_store = true");
    let off = policy(&redis.url(), "");
    let grpc_addr = format!("127.0.0.1:{}", free_port());
    let checked = Ratewatch::start(
        "serve",
        Some(on.path()),
        &[("RATEWATCH_GRPC_LISTEN", &grpc_addr)],
    );
    let plain = Ratewatch::start("serve", Some(off.path()), &[]);
    let c = channel(&grpc_addr).await;

    assert_eq!(until_healthcheck(&http, &checked, 200).await, "OK");
    assert_eq!(grpc_health(&c).await, ServingStatus::Serving as i32);

    redis.kill();
    let why = until_healthcheck(&http, &checked, 500).await;
    assert_eq!(why, "store unreachable");
    assert_eq!(grpc_health(&c).await, ServingStatus::NotServing as i32);
    // /health (liveness) and /ready do not depend on the store.
    for path in ["/health", "/ready"] {
        let r = http
            .get(format!("{}{path}", checked.url()))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{path}");
    }
    // Without the key, the same outage leaves /healthcheck at 200.
    let deadline = Instant::now() + Duration::from_secs(60);
    while !breaker_open(&http, &plain).await {
        assert!(Instant::now() < deadline, "the breaker never opened");
        traffic(&http, &plain).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(healthcheck(&http, &plain).await, (200, "OK".to_owned()));

    redis.restart();
    assert_eq!(until_healthcheck(&http, &checked, 200).await, "OK");
    assert_eq!(grpc_health(&c).await, ServingStatus::Serving as i32);
}
