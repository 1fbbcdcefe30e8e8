//! Settling on real Redis processes: charges and refunds on one node and
//! on a 3-master cluster (a request's limits in several slots), a window
//! that rolls between the decision and the settle, a Redis killed before
//! the settle, leases, and the overshoot bound of tokens per minute on two
//! limiters sharing one Redis.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::routing::post;
use http::{Request, StatusCode};
use ratewatch::identity::{Identity, IdentityKind};
use ratewatch::policy::{LeaseMode, Scope, StoreKind, StoreSettings};
use ratewatch::{Limit, Limiter, Meter, Policy, RouteRule, Settled, Tier};
use support::{RedisCluster, RedisServer};
use tower::ServiceExt;

fn on(store: StoreSettings, limits: Vec<Limit>) -> Policy {
    let mut free = Tier::new("free");
    for l in limits {
        free = free.limit(l);
    }
    Policy::builder()
        .tier(free)
        .tier(Tier::new("anonymous").limit(Limit::per_second("burst", 5)))
        .route(RouteRule::new("POST", "/llm"))
        .store(store)
        .build()
        .unwrap()
}

fn redis(server: &RedisServer) -> StoreSettings {
    StoreSettings {
        kind: StoreKind::Redis,
        url: Some(server.url()),
        timeout: Duration::from_millis(500),
        ..Default::default()
    }
}

fn caller(key: &str) -> Identity {
    Identity::new(IdentityKind::ApiKey, key).with_ip(Some("192.0.2.7".parse().unwrap()))
}

async fn remaining(limiter: &Limiter, who: &Identity) -> Vec<f64> {
    let route = limiter.route_for("POST", "/llm");
    limiter
        .peek(who, "free", route)
        .await
        .limits
        .iter()
        // Whole units: a bucket refills a little meanwhile.
        .map(|l| l.remaining.expect("known").floor())
        .collect()
}

const MINUTE: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_settle_refunds_and_charges_on_redis() {
    let server = RedisServer::start();
    let limiter = Limiter::new(on(
        redis(&server),
        vec![
            Limit::fixed_window("tokens", 1000, MINUTE),
            Limit::token_bucket("bucket", 500, 0.000_001),
            Limit::gcra("gcra", 0.001, 400),
        ],
    ))
    .await
    .unwrap();
    let who = caller("free_redis");
    let (d, r) = limiter.reserve(&who, "free", None, 300).await;
    assert!(d.allowed);
    assert_eq!(r.unwrap().settle(100).await, Settled::Refunded(200));
    assert_eq!(remaining(&limiter, &who).await, vec![900.0, 400.0, 300.0]);
    let (_, r) = limiter.reserve(&who, "free", None, 50).await;
    assert_eq!(r.unwrap().settle(250).await, Settled::Charged(200));
    assert_eq!(remaining(&limiter, &who).await, vec![650.0, 150.0, 50.0]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_settle_reaches_every_slot_of_a_request_on_a_cluster() {
    let cluster = RedisCluster::start();
    let store = StoreSettings {
        kind: StoreKind::RedisCluster,
        nodes: cluster.urls(),
        timeout: Duration::from_secs(1),
        ..Default::default()
    };
    let limiter = Limiter::new(on(
        store,
        vec![
            Limit::fixed_window("tokens", 1000, MINUTE),
            Limit::fixed_window("per_ip", 2000, MINUTE).with_scope(Scope::Ip),
            // A route ceiling is `auto` by default: pressed, the whole
            // request would be leased and the store would show the lease's
            // units held. Exact, the store holds what was charged.
            Limit::fixed_window("route", 5000, MINUTE)
                .with_scope(Scope::Route)
                .with_mode(LeaseMode::Exact),
        ],
    ))
    .await
    .unwrap();
    let who = caller("free_cluster");
    let route = || limiter.route_for("POST", "/llm");
    let (d, r) = limiter.reserve(&who, "free", route(), 300).await;
    assert!(d.allowed);
    assert_eq!(r.unwrap().settle(40).await, Settled::Refunded(260));
    assert_eq!(remaining(&limiter, &who).await, vec![960.0, 1960.0, 4960.0]);
    let (_, r) = limiter.reserve(&who, "free", route(), 10).await;
    assert_eq!(r.unwrap().settle(110).await, Settled::Charged(100));
    assert_eq!(remaining(&limiter, &who).await, vec![850.0, 1850.0, 4850.0]);
    // Three slots were asked: the keys did span several.
    let settles = cluster.command_calls("evalsha");
    assert!(settles >= 3, "{settles}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_settle_goes_to_the_master_the_sentinels_name() {
    let set = support::sentinel::SentinelSet::start();
    let limiter = Limiter::new(on(
        StoreSettings {
            kind: StoreKind::RedisSentinel,
            sentinels: set.urls(),
            master_name: Some(support::sentinel::MASTER_NAME.into()),
            timeout: Duration::from_millis(500),
            ..Default::default()
        },
        vec![Limit::fixed_window("tokens", 1000, MINUTE)],
    ))
    .await
    .unwrap();
    let who = caller("free_sentinel");
    // The sentinels name the master in the background.
    let deadline = Instant::now() + Duration::from_secs(10);
    let r = loop {
        let (d, r) = limiter.reserve(&who, "free", None, 0).await;
        if !d.is_fallback() {
            break r;
        }
        assert!(Instant::now() < deadline, "no master named");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let (_, r2) = limiter.reserve(&who, "free", None, 300).await;
    assert_eq!(r2.unwrap().settle(100).await, Settled::Refunded(200));
    assert_eq!(r.unwrap().settle(50).await, Settled::Charged(50));
    assert_eq!(remaining(&limiter, &who).await, vec![850.0]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_window_that_rolls_between_check_and_settle_gets_nothing_back_on_redis() {
    let server = RedisServer::start();
    let second = Duration::from_secs(1);
    let limiter = Limiter::new(on(
        redis(&server),
        vec![Limit::fixed_window("tokens", 1000, second)],
    ))
    .await
    .unwrap();
    let who = caller("free_roll");
    let (d, r) = limiter.reserve(&who, "free", None, 600).await;
    assert!(d.allowed);
    // Wait (on Redis's clock, through the decisions) for the next window.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let d = limiter.check_cost(&who, "free", None, 10).await;
        if d.limits[0].remaining == Some(990.0) {
            break;
        }
        assert!(Instant::now() < deadline, "the window never rolled");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    r.unwrap().settle(0).await;
    let left = remaining(&limiter, &who).await[0];
    // Still the new window's own count (or a fresh window after it).
    assert!(left == 990.0 || left == 1000.0, "{left}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_killed_before_the_settle_fails_it_within_the_budget_and_the_response_is_unaffected()
 {
    let server = Arc::new(parking_lot::Mutex::new(RedisServer::start()));
    let url = server.lock().url();
    let limiter = Limiter::new(on(
        StoreSettings {
            kind: StoreKind::Redis,
            url: Some(url),
            timeout: Duration::from_millis(200),
            ..Default::default()
        },
        vec![Limit::fixed_window("tokens", 1000, MINUTE)],
    ))
    .await
    .unwrap();
    let who = caller("free_killed");
    let (_, kept) = limiter.reserve(&who, "free", None, 100).await;
    let killer = server.clone();
    let app = Router::new()
        .route(
            "/llm",
            post(move |axum::Extension(meter): axum::Extension<Meter>| {
                let killer = killer.clone();
                async move {
                    meter.record(3);
                    killer.lock().kill();
                    "answered"
                }
            }),
        )
        .layer(limiter.layer().with_cost(|_| Some(100)));
    let req = Request::post("/llm")
        .header("x-api-key", "free_killed")
        .body(Body::empty())
        .unwrap();
    let res = app.oneshot(req).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let body = axum::body::to_bytes(res.into_body(), 64).await.unwrap();
    assert_eq!(&body[..], b"answered");
    // The settle fails within the budget, and is counted as failed.
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    let kept = kept.unwrap();
    let started = Instant::now();
    let settled = tokio::task::block_in_place(|| {
        metrics::with_local_recorder(&recorder, || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
                .block_on(kept.settle(0))
        })
    });
    assert_eq!(settled, Settled::Failed);
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    let text = handle.render();
    assert!(
        text.contains(r#"ratewatch_settles_total{tier="free",route="*",outcome="failed"} 1"#),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_leases_a_settle_goes_to_the_store_and_totals_stay_exact() {
    let server = RedisServer::start();
    let limiter = Limiter::new(on(
        redis(&server),
        vec![Limit::fixed_window("tokens", 1000, MINUTE).with_mode(LeaseMode::Leased)],
    ))
    .await
    .unwrap();
    let who = caller("free_leased");
    for _ in 0..10 {
        let (d, r) = limiter.reserve(&who, "free", None, 20).await;
        assert!(d.allowed);
        assert_eq!(r.unwrap().settle(5).await, Settled::Refunded(15));
    }
    // Leases give back what they did not spend: the store then holds the
    // ten requests' actual 5 units each.
    limiter.shutdown().await;
    let fresh = Limiter::new(on(
        redis(&server),
        vec![Limit::fixed_window("tokens", 1000, MINUTE)],
    ))
    .await
    .unwrap();
    assert_eq!(remaining(&fresh, &who).await, vec![950.0]);
}

/// Tokens per window with a reserved estimate, settled after each answer,
/// on two limiters sharing one Redis: per window, the tokens the admitted
/// requests really used never pass `limit + concurrency × (max actual −
/// reserve)`, the README's bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tokens_per_window_on_two_limiters_never_exceed_the_documented_bound() {
    const LIMIT: u64 = 2_000;
    const RESERVE: u64 = 100;
    const MAX_ACTUAL: u64 = 400;
    const PER_LIMITER: usize = 4;
    const CONCURRENCY: u64 = 2 * PER_LIMITER as u64;
    let window = Duration::from_secs(2);
    let server = RedisServer::start();
    let policy = || {
        on(
            redis(&server),
            vec![Limit::fixed_window("tokens", LIMIT, window)],
        )
    };
    let limiters = [
        Limiter::new(policy()).await.unwrap(),
        Limiter::new(policy()).await.unwrap(),
    ];
    // Tokens used per window (by the decision's time on Redis's clock).
    let used: Arc<parking_lot::Mutex<std::collections::BTreeMap<u64, u64>>> = Arc::default();
    let blocked = Arc::new(AtomicU64::new(0));
    let stop = Instant::now() + Duration::from_secs(7);
    let mut tasks = Vec::new();
    for (n, limiter) in limiters.iter().enumerate() {
        for t in 0..PER_LIMITER {
            let (limiter, used, blocked) = (limiter.clone(), used.clone(), blocked.clone());
            tasks.push(tokio::spawn(async move {
                let who = caller("free_tpm");
                let mut i = (n * 31 + t * 7) as u64;
                while Instant::now() < stop {
                    let (d, r) = limiter.reserve(&who, "free", None, RESERVE).await;
                    let Some(r) = r else {
                        blocked.fetch_add(1, Ordering::Relaxed);
                        tokio::time::sleep(Duration::from_millis(5)).await;
                        continue;
                    };
                    i = i
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    // Mostly over the estimate, often at the maximum.
                    let actual = match (i >> 33) % 4 {
                        0 => (i >> 40) % RESERVE,
                        _ => MAX_ACTUAL,
                    };
                    tokio::time::sleep(Duration::from_millis(10 + (i >> 50) % 20)).await;
                    *used
                        .lock()
                        .entry(d.decided_at / window.as_micros() as u64)
                        .or_default() += actual;
                    r.settle(actual).await;
                }
            }));
        }
    }
    for t in tasks {
        t.await.unwrap();
    }
    let bound = LIMIT + CONCURRENCY * (MAX_ACTUAL - RESERVE);
    let used = used.lock().clone();
    let peak = used.values().copied().max().unwrap();
    eprintln!("tokens used per window: {used:?}; limit {LIMIT}, bound {bound}");
    assert!(
        used.values().all(|&u| u <= bound),
        "per window {used:?}, bound {bound}"
    );
    assert!(
        peak > LIMIT,
        "the test must overshoot the limit to test the bound: {used:?}"
    );
    assert!(blocked.load(Ordering::Relaxed) > 0);
}

/// A settle after a reload that changed a limit's numbers is not made on
/// Redis either: lua/settle.lua would read the bucket under the old
/// capacity and write it back tagged with it, so a refund of 100 from a
/// bucket raised from 100 to 1000 would hand back 1000 tokens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_settle_after_a_reload_that_changed_the_limit_is_not_made_on_redis() {
    let server = RedisServer::start();
    let bucket = |capacity| {
        on(
            redis(&server),
            vec![Limit::token_bucket("bucket", capacity, 0.000_001)],
        )
    };
    let limiter = Limiter::new(bucket(100)).await.unwrap();
    let who = caller("free_reload");
    let (d, r) = limiter.reserve(&who, "free", None, 100).await;
    assert!(d.allowed);
    limiter.replace_policy(bucket(1000)).unwrap();
    assert!(limiter.check_cost(&who, "free", None, 900).await.allowed);
    assert_eq!(remaining(&limiter, &who).await, vec![0.0]);
    assert_eq!(r.unwrap().settle(0).await, Settled::Stale);
    assert_eq!(
        remaining(&limiter, &who).await,
        vec![0.0],
        "a refund with the old capacity handed out tokens"
    );
}

/// With Redis down and the failure policy open, the request passes with
/// nothing reserved: a handler written as the README's, taking
/// `Extension<Meter>`, still runs (its meter settles nothing) instead of
/// failing its extraction with a 500, which would turn "open" into an
/// outage of every metered route.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_the_failure_policy_lets_through_still_has_a_meter_that_settles_nothing() {
    let mut server = RedisServer::start();
    let mut policy = on(
        StoreSettings {
            kind: StoreKind::Redis,
            url: Some(server.url()),
            timeout: Duration::from_millis(200),
            ..Default::default()
        },
        vec![Limit::fixed_window("tokens", 1000, MINUTE)],
    );
    policy.resilience.on_store_failure = ratewatch::policy::FailurePolicy::Open;
    let limiter = Limiter::new(policy).await.unwrap();
    server.kill();
    let app = Router::new()
        .route(
            "/llm",
            post(
                |axum::Extension(meter): axum::Extension<Meter>| async move {
                    meter.record(500);
                    meter.reserved().to_string()
                },
            ),
        )
        .layer(limiter.layer().with_cost(|_| Some(100)));
    let req = Request::post("/llm")
        .header("x-api-key", "free_open")
        .body(Body::empty())
        .unwrap();
    let res = app.oneshot(req).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK, "the failure policy is open");
    let body = axum::body::to_bytes(res.into_body(), 64).await.unwrap();
    assert_eq!(&body[..], b"0", "nothing was reserved");
}
