//! Faults against real redis-server processes, under concurrent load:
//! every request still gets a prompt, declared answer.

mod support;

use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use http::Request;
use ratewatch::policy::{
    BreakerSettings, FailurePolicy, Limit, Policy, ResilienceSettings, RouteRule, StoreKind,
    StoreSettings, Tier,
};
use ratewatch::{Limiter, server};
use support::{RedisCluster, RedisServer};
use tower::ServiceExt;

const TIMEOUT: Duration = Duration::from_millis(50);
/// How late an answer may be and still prove the store budget held: well
/// under the Redis client's own 500 ms response timeout and 1 s connect
/// timeout (what a call without the budget would wait for), and wide
/// enough for a machine at load 8 to schedule 200 concurrent tasks.
const PROMPT: Duration = Duration::from_millis(400);

fn policy(store: StoreSettings, default: FailurePolicy, breaker_failures: u32) -> Policy {
    Policy::builder()
        .store(store)
        .resilience(ResilienceSettings {
            on_store_failure: default,
            breaker: BreakerSettings {
                failures: breaker_failures,
                open: Duration::from_millis(500),
                ..Default::default()
            },
            expected_instances: 4,
            ..Default::default()
        })
        .tier(
            Tier::new("free")
                .match_prefix("free_")
                .limit(Limit::token_bucket("burst", 40, 0.000001)),
        )
        .tier(Tier::new("anonymous").limit(Limit::token_bucket("burst", 40, 0.000001)))
        .route(RouteRule::new("POST", "/api/export").on_store_failure(FailurePolicy::Closed))
        .build()
        .expect("valid policy")
}

fn redis_store(url: String) -> StoreSettings {
    StoreSettings {
        kind: StoreKind::Redis,
        url: Some(url),
        timeout: TIMEOUT,
        ..Default::default()
    }
}

async fn app(p: Policy) -> (Router, Limiter) {
    let limiter = Limiter::new(p)
        .await
        .expect("limiter starts even if Redis is down");
    (server::app(limiter.clone()), limiter)
}

async fn send(
    app: &Router,
    method: &str,
    path: &str,
    key: &str,
) -> (u16, Duration, http::HeaderMap) {
    let req = Request::builder()
        .method(method)
        .uri(path)
        .header("x-api-key", key)
        .body(Body::empty())
        .unwrap();
    let started = Instant::now();
    let res = app.clone().oneshot(req).await.unwrap();
    (
        res.status().as_u16(),
        started.elapsed(),
        res.headers().clone(),
    )
}

/// Sends `n` concurrent requests and returns their statuses and latencies.
async fn burst(
    app: &Router,
    method: &'static str,
    path: &'static str,
    keys: usize,
    n: usize,
) -> Vec<(u16, Duration, http::HeaderMap)> {
    let mut tasks = Vec::new();
    for i in 0..n {
        let app = app.clone();
        tasks.push(tokio::spawn(async move {
            send(&app, method, path, &format!("free_client_{}", i % keys)).await
        }));
    }
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.unwrap());
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_killed_redis_gets_prompt_answers_by_policy() {
    let mut redis = RedisServer::start();
    let (app, _) = app(policy(redis_store(redis.url()), FailurePolicy::Open, 5)).await;
    assert_eq!(send(&app, "GET", "/api/users", "free_warm").await.0, 200);
    redis.kill();

    let open = burst(&app, "GET", "/api/users", 10, 200).await;
    let bound = PROMPT;
    for (status, took, headers) in &open {
        assert_eq!(*status, 200, "fail-open routes let traffic through");
        assert!(*took < bound, "answered in {took:?}, over {bound:?}");
        // Nothing was counted: the policy is stated, no remaining is made up.
        assert!(headers.contains_key("ratelimit-policy"));
        assert!(!headers.contains_key("ratelimit"));
    }
    let closed = burst(&app, "POST", "/api/export", 10, 100).await;
    for (status, took, headers) in &closed {
        assert_eq!(*status, 503, "fail-closed routes refuse");
        assert!(headers.contains_key("retry-after"));
        assert!(headers.contains_key("ratelimit-policy"));
        assert!(*took < bound, "answered in {took:?}, over {bound:?}");
    }
    let metrics = metrics_text();
    let shard = format!("shard=\"{}\"", redis.addr());
    let fallbacks = |reason: &str, policy: &str| {
        metrics
            .lines()
            .filter(|l| l.starts_with("ratewatch_fallbacks_total{") && l.contains(&shard))
            .filter(|l| {
                l.contains(&format!("reason=\"{reason}\""))
                    && l.contains(&format!("policy=\"{policy}\""))
            })
            .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
            .sum::<f64>()
    };
    // Every fallback is counted with its reason: the 200 concurrent calls
    // all reached the dead Redis (errors) and tripped the breaker, which
    // then answered the 100 fail-closed requests without a call.
    assert_eq!(
        fallbacks("error", "open")
            + fallbacks("breaker_open", "open")
            + fallbacks("timeout", "open"),
        200.0
    );
    assert_eq!(fallbacks("breaker_open", "closed"), 100.0);
    assert!(
        metrics.contains(&format!("ratewatch_breaker_state{{{shard}}} 2")),
        "open: {metrics}"
    );
    // The series exist from start-up, at zero; an outage moves none.
    assert!(
        !metrics
            .lines()
            .any(|l| l.starts_with("ratewatch_limit_exceeded_total")
                && l.contains("tier=\"free\"")
                && !l.ends_with(" 0")),
        "an outage is not clients exceeding their limits"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_local_fallback_admits_no_more_than_its_share() {
    let mut redis = RedisServer::start();
    let (app, _) = app(policy(redis_store(redis.url()), FailurePolicy::Local, 5)).await;
    redis.kill();
    let results = burst(&app, "GET", "/api/users", 1, 100).await;
    let admitted = results.iter().filter(|r| r.0 == 200).count();
    // 40 per identity across 4 expected instances: this one may admit 10.
    assert_eq!(
        admitted, 10,
        "local fallback admits exactly limit / expected_instances"
    );
    assert!(results.iter().all(|r| r.0 == 200 || r.0 == 429));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_frozen_redis_trips_the_breaker_and_receives_no_calls_until_the_probe() {
    let redis = RedisServer::start();
    let (app, _) = app(policy(redis_store(redis.url()), FailurePolicy::Open, 5)).await;
    assert_eq!(send(&app, "GET", "/api/users", "free_warm").await.0, 200);
    redis.cli(&["CONFIG", "RESETSTAT"]);
    redis.pause();
    // Sequential requests: the first five time out, then the breaker opens
    // and the rest are answered without calling Redis at all.
    let started = Instant::now();
    for _ in 0..50 {
        let (status, took, _) = send(&app, "GET", "/api/users", "free_frozen").await;
        assert_eq!(status, 200);
        assert!(took < PROMPT, "answered in {took:?}, over {PROMPT:?}");
    }
    // Without the breaker the 50 calls would wait 50 × 50 ms = 2.5 s.
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "breaker opened: later calls did not wait"
    );
    let frozen_for = started.elapsed();
    redis.resume();
    // The calls sent while Redis was frozen run once it resumes: wait for
    // them, not for a fixed time.
    let calls = || redis.command_calls("evalsha") + redis.command_calls("eval");
    let deadline = Instant::now() + Duration::from_secs(5);
    while calls() < 5 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Only the five calls before the breaker opened reached Redis, not the
    // other 45; a background health check may have queued one call per
    // cooldown (500 ms) while Redis was frozen.
    let probes = frozen_for.as_millis() as u64 / 500 + 1;
    let calls = calls();
    assert!(
        (5..=5 + probes).contains(&calls),
        "{calls} calls reached Redis: only the 5 before the breaker opened (and at most {probes} health checks) should have"
    );

    // After open_ms a probe goes through, the breaker closes, and decisions
    // are exact again.
    tokio::time::sleep(Duration::from_millis(600)).await;
    for _ in 0..40 {
        assert_eq!(send(&app, "GET", "/api/users", "free_after").await.0, 200);
    }
    assert_eq!(send(&app, "GET", "/api/users", "free_after").await.0, 429);
    let metrics = metrics_text();
    let shard = redis.addr();
    assert!(
        metrics.contains(&format!("ratewatch_breaker_state{{shard=\"{shard}\"}} 0")),
        "closed again after the probe: {metrics}"
    );
    assert!(
        metrics.contains(&format!(
            "ratewatch_breaker_trips_total{{shard=\"{shard}\"}} 1"
        )),
        "one trip: {metrics}"
    );
}

/// The Prometheus exposition of this process (the limiter installs the
/// global recorder).
fn metrics_text() -> String {
    let handle = ratewatch::telemetry::metrics::install_prometheus().expect("recorder");
    ratewatch::telemetry::render(&handle)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_restarted_redis_loses_its_scripts_and_no_error_reaches_a_client() {
    let mut redis = RedisServer::start();
    let (app, _) = app(policy(redis_store(redis.url()), FailurePolicy::Closed, 5)).await;
    for _ in 0..10 {
        assert_eq!(send(&app, "GET", "/api/users", "free_restart").await.0, 200);
    }
    redis.restart();
    // Give the connection manager a moment to reconnect, as any client
    // would see after a restart; then every decision is exact.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (status, _, _) = send(&app, "GET", "/api/users", "free_probe").await;
        if status == 200 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "decisions never came back to Redis"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The counters were lost with the restart: a fresh identity gets exactly 40.
    let results = burst(&app, "GET", "/api/users", 1, 60).await;
    let ok = results.iter().filter(|r| r.0 == 200).count();
    let limited = results.iter().filter(|r| r.0 == 429).count();
    assert_eq!((ok, limited), (40, 20), "exact again, no 5xx");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_server_started_while_redis_is_down_answers_by_policy_and_connects_later() {
    let port = support::free_port();
    let store = redis_store(format!("redis://127.0.0.1:{port}"));
    let (app, _) = app(policy(store, FailurePolicy::Closed, 3)).await;
    let (status, took, _) = send(&app, "GET", "/api/users", "free_early").await;
    assert_eq!(status, 503);
    assert!(took < Duration::from_millis(500));
    let _redis = RedisServer::start_on(port);
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        if send(&app, "GET", "/api/users", "free_early").await.0 == 200 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "never connected to the Redis that appeared"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn on_a_cluster_only_the_lost_shards_identities_fall_back() {
    let mut cluster = RedisCluster::start();
    let store = StoreSettings {
        kind: StoreKind::RedisCluster,
        nodes: cluster.urls(),
        // The healthy shards must answer within it on a machine at load 8
        // (at 100 ms one of them timed out there and answered 503).
        timeout: Duration::from_millis(500),
        ..Default::default()
    };
    let (app, limiter) = app(policy(store, FailurePolicy::Closed, 3)).await;
    // Find identities on each master by the shard their decision names.
    let victim = cluster.nodes[0].addr();
    let mut on_victim = Vec::new();
    let mut elsewhere = Vec::new();
    for i in 0..60 {
        let key = format!("free_spread_{i}");
        let id = ratewatch::Identity::new(ratewatch::identity::IdentityKind::ApiKey, key.clone());
        let d = limiter.peek(&id, "free", None).await;
        if **d.source.shard() == *victim {
            on_victim.push(key);
        } else {
            elsewhere.push(key);
        }
    }
    assert!(!on_victim.is_empty() && !elsewhere.is_empty());
    cluster.nodes[0].kill();
    for key in elsewhere.iter().take(5) {
        for _ in 0..40 {
            assert_eq!(
                send(&app, "GET", "/api/users", key).await.0,
                200,
                "other shards stay exact"
            );
        }
        assert_eq!(
            send(&app, "GET", "/api/users", key).await.0,
            429,
            "and still block at the bound"
        );
    }
    for key in on_victim.iter().take(3) {
        let (status, took, _) = send(&app, "GET", "/api/users", key).await;
        assert_eq!(status, 503, "the lost shard's identities fail closed");
        // Within the store's timeout and a loaded machine's scheduling:
        // promptly, not after a reconnect's back-off.
        assert!(took < Duration::from_millis(1500), "took {took:?}");
    }
}

/// Waits until decisions for `prober` come from the store again: Redis is
/// back, the connection remade and the shard's breaker closed by a probe.
async fn until_the_store_decides(limiter: &Limiter, prober: &ratewatch::Identity) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let d = limiter.check(prober, "free", None).await;
        if matches!(d.source, ratewatch::Source::Store { .. }) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "decisions never came back to Redis"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_flapping_redis_does_not_hand_the_local_share_out_again_on_every_flap() {
    let mut redis = RedisServer::start();
    let (app, limiter) = app(policy(redis_store(redis.url()), FailurePolicy::Local, 5)).await;
    let prober = ratewatch::Identity::new(ratewatch::identity::IdentityKind::ApiKey, "free_prober");
    until_the_store_decides(&limiter, &prober).await;
    // The victim only ever asks while Redis is down, so everything it gets
    // comes from the local fallback: 40 per identity over 4 expected
    // instances is a share of 10, which refills at one token per ~11 days.
    let mut admitted = Vec::new();
    for flap in 0..3 {
        redis.kill();
        let results = burst(&app, "GET", "/api/users", 1, 20).await;
        assert!(
            results.iter().all(|r| r.0 == 200 || r.0 == 429),
            "flap {flap}"
        );
        admitted.push(results.iter().filter(|r| r.0 == 200).count());
        // Redis comes back, a probe closes the breaker: the flap is over.
        redis.restart();
        until_the_store_decides(&limiter, &prober).await;
    }
    assert_eq!(
        admitted,
        vec![10, 0, 0],
        "the local share is spent once, not once per flap"
    );
}
