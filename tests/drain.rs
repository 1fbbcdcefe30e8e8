//! Readiness and the drain of `ratewatch serve`: `/health` is liveness,
//! `/ready`, `/healthcheck` and gRPC health fail from the moment SIGTERM
//! arrives; the ports serve through the drain, then close; and with a
//! frozen Redis the shutdown still ends within the store's budget plus a
//! second. The real binary, a real Redis frozen with SIGSTOP.

mod support;

use std::time::{Duration, Instant};

use ratewatch::service::grpc::ProstCodec;
use ratewatch::service::proto::{HealthCheckRequest, HealthCheckResponse, ServingStatus};
use support::{Ratewatch, RedisServer, free_port, policy_file};

async fn get(url: &str) -> Result<(u16, String), reqwest::Error> {
    let res = reqwest::Client::new()
        .get(url)
        .timeout(Duration::from_secs(5))
        .send()
        .await?;
    let status = res.status().as_u16();
    Ok((status, res.text().await?))
}

async fn grpc_health(port: u16) -> i32 {
    let channel = tonic::transport::Channel::from_shared(format!("http://127.0.0.1:{port}"))
        .unwrap()
        .connect()
        .await
        .expect("connect to the gRPC port");
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.expect("ready");
    grpc.unary(
        tonic::Request::new(HealthCheckRequest {
            service: String::new(),
        }),
        http::uri::PathAndQuery::from_static("/grpc.health.v1.Health/Check"),
        ProstCodec::<HealthCheckRequest, HealthCheckResponse>::default(),
    )
    .await
    .expect("a health answer")
    .into_inner()
    .status
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_sigterm_readiness_fails_at_once_while_the_ports_serve_through_the_drain() {
    let grpc_port = free_port();
    let grpc = format!("127.0.0.1:{grpc_port}");
    let mut server = Ratewatch::start_logged(
        "serve",
        None,
        &[("RATEWATCH_DRAIN_MS", "4000")],
        &["--grpc-listen", &grpc],
    );
    let base = server.url();
    assert_eq!(
        get(&format!("{base}/ready")).await.unwrap(),
        (200, "ready".into())
    );
    assert_eq!(
        get(&format!("{base}/healthcheck")).await.unwrap(),
        (200, "OK".into())
    );
    assert_eq!(grpc_health(grpc_port).await, ServingStatus::Serving as i32);

    let term = Instant::now();
    server.signal("TERM");
    let deadline = Instant::now() + Duration::from_secs(3);
    while get(&format!("{base}/ready")).await.unwrap().0 != 503 {
        assert!(
            Instant::now() < deadline,
            "/ready still passes after SIGTERM"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Draining: readiness fails everywhere, liveness and the work go on.
    assert_eq!(get(&format!("{base}/healthcheck")).await.unwrap().0, 500);
    assert_eq!(
        grpc_health(grpc_port).await,
        ServingStatus::NotServing as i32
    );
    assert_eq!(
        get(&format!("{base}/health")).await.unwrap(),
        (200, "ok".into())
    );
    assert_eq!(get(&format!("{base}/api/users")).await.unwrap().0, 200);
    assert!(
        term.elapsed() < Duration::from_secs(4),
        "the checks above ran past the drain; the test proves nothing"
    );
    let status = tokio::task::spawn_blocking(move || {
        let s = server.wait_exit(Duration::from_secs(20));
        (s, server)
    })
    .await
    .unwrap();
    let (status, server) = status;
    let status =
        status.unwrap_or_else(|| panic!("still running 20 s after SIGTERM: {}", server.log()));
    assert!(status.success(), "{status:?}: {}", server.log());
    assert!(
        term.elapsed() >= Duration::from_millis(3900),
        "the ports closed before the 4 s drain ended ({:?})",
        term.elapsed()
    );
    assert!(
        reqwest::get(format!("{base}/health")).await.is_err(),
        "the port is still open"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_no_drain_and_a_frozen_redis_shutdown_takes_the_store_budget_plus_a_second() {
    let redis = RedisServer::start();
    let policy = policy_file(&format!(
        r#"
[store]
kind = "redis"
url = "{}"
timeout_ms = 1000

[[tiers]]
name = "free"
match_prefix = "free_"
limits = [{{ name = "minute", algorithm = "fixed_window", limit = 100, window = "60s" }}]

[[tiers]]
name = "anonymous"
limits = [{{ name = "minute", algorithm = "fixed_window", limit = 100, window = "60s" }}]
"#,
        redis.url()
    ));
    let mut server = Ratewatch::start_logged("serve", Some(policy.path()), &[], &[]);
    let url = format!("{}/api/users", server.url());
    let client = reqwest::Client::new();
    let first = client
        .get(&url)
        .header("x-api-key", "free_a")
        .send()
        .await
        .unwrap();
    assert_eq!(first.status().as_u16(), 200);
    redis.pause();
    // A request caught by the freeze, still running when SIGTERM comes.
    let running = tokio::spawn({
        let client = client.clone();
        let url = url.clone();
        async move { client.get(&url).header("x-api-key", "free_b").send().await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let term = Instant::now();
    server.signal("TERM");
    let (status, server) = tokio::task::spawn_blocking(move || {
        let s = server.wait_exit(Duration::from_secs(30));
        (s, server)
    })
    .await
    .unwrap();
    let took = term.elapsed();
    assert!(
        status.is_some(),
        "still running 30 s after SIGTERM: {}",
        server.log()
    );
    // The budget (1 s) plus a second, with room for a loaded machine
    // (before, shutdown waited 4.7 s for the frozen store).
    assert!(
        took < Duration::from_millis(3500),
        "shutdown with a frozen Redis took {took:?}: {}",
        server.log()
    );
    // The running request was answered (by the failure policy), not cut.
    let answer = running
        .await
        .unwrap()
        .expect("the running request was answered");
    assert_eq!(answer.status().as_u16(), 200);
    redis.resume();
}
