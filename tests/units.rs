//! Limits counting units: one tier holding requests per minute, tokens per
//! minute and an in-flight limit, charged in one atomic decision, all or
//! nothing, each limit in its own unit; a request naming no tokens checked
//! without charge; settles per unit. The same answers on the memory store,
//! a Redis node and a Redis Cluster.

mod support;

use std::time::Duration;

use ratewatch::identity::{Identity, IdentityKind};
use ratewatch::policy::{StoreKind, StoreSettings};
use ratewatch::{Costs, Decision, Limit, Limiter, Policy, RouteRule, Settled, Tier};
use support::{RedisCluster, RedisServer};

/// A refill so slow nothing comes back during a test.
const SLOW: f64 = 0.000_001;

fn policy(store: StoreSettings) -> Policy {
    Policy::builder()
        .tier(
            Tier::new("free")
                .limit(Limit::token_bucket("rpm", 10, SLOW))
                .limit(Limit::token_bucket("tpm", 1000, SLOW).unit("tokens"))
                .limit(Limit::concurrency("streams", 2)),
        )
        .tier(Tier::new("anonymous").limit(Limit::per_second("burst", 5)))
        .route(RouteRule::new("POST", "/v1/chat").with_cost(2))
        .store(store)
        .build()
        .unwrap()
}

fn redis(server: &RedisServer) -> StoreSettings {
    StoreSettings {
        kind: StoreKind::Redis,
        url: Some(server.url()),
        timeout: Duration::from_secs(2),
        ..Default::default()
    }
}

fn cluster(c: &RedisCluster) -> StoreSettings {
    StoreSettings {
        kind: StoreKind::RedisCluster,
        nodes: c.urls(),
        timeout: Duration::from_secs(2),
        ..Default::default()
    }
}

fn caller(key: &str) -> Identity {
    Identity::new(IdentityKind::ApiKey, key)
}

fn tokens(n: u64) -> Costs {
    Costs::new().with("tokens", n)
}

/// Whole units left of `name` in `d`.
fn left(d: &Decision, name: &str) -> f64 {
    d.limits
        .iter()
        .find(|l| l.name.as_ref() == name)
        .unwrap_or_else(|| panic!("no limit {name}"))
        .remaining
        .expect("known")
        .floor()
}

async fn peek(limiter: &Limiter, who: &Identity) -> Decision {
    limiter.peek(who, "free", None).await
}

/// Every unit's rule, on one store.
async fn units_on(store: StoreSettings) {
    let limiter = Limiter::new(policy(store)).await.unwrap();

    // One decision, each limit charged in its own unit.
    let who = caller("free_a");
    let d = limiter.check_costs(&who, "free", None, &tokens(300)).await;
    assert!(d.allowed, "{d:?}");
    assert!(!d.is_fallback());
    assert_eq!(left(&d, "rpm"), 9.0);
    assert_eq!(left(&d, "tpm"), 700.0);
    assert_eq!(left(&d, "streams"), 1.0, "the request holds one slot");
    let units: Vec<&str> = d.units().map(|u| u.as_ref()).collect();
    assert_eq!(units, ["requests", "tokens"]);
    drop(d);
    // The route's cost is in requests; tokens stay what the request says.
    let route = limiter.route_for("POST", "/v1/chat");
    let d = limiter.check_costs(&who, "free", route, &tokens(100)).await;
    assert!(d.allowed);
    assert_eq!((left(&d, "rpm"), left(&d, "tpm")), (7.0, 600.0));
    drop(d);

    // All or nothing across units: a tokens refusal charges no request.
    let d = limiter.check_costs(&who, "free", None, &tokens(601)).await;
    assert!(!d.allowed);
    assert_eq!(
        d.refused_by().expect("refused by a limit").name.as_ref(),
        "tpm"
    );
    assert_eq!(d.refused_by().unwrap().unit.as_ref(), "tokens");
    let after = peek(&limiter, &who).await;
    assert_eq!((left(&after, "rpm"), left(&after, "tpm")), (7.0, 600.0));
    // And a requests refusal charges no token.
    let d = limiter
        .check_costs(&who, "free", None, &tokens(10).with("requests", 8))
        .await;
    assert!(!d.allowed);
    assert_eq!(d.refused_by().unwrap().name.as_ref(), "rpm");
    let after = peek(&limiter, &who).await;
    assert_eq!((left(&after, "rpm"), left(&after, "tpm")), (7.0, 600.0));

    // Check now, charge later: a request naming no tokens is checked
    // without charge, and refused once the tokens are used up.
    let who = caller("free_b");
    assert!(
        limiter
            .check_costs(&who, "free", None, &tokens(999))
            .await
            .allowed
    );
    let d = limiter.check_costs(&who, "free", None, &Costs::new()).await;
    assert!(d.allowed, "one token left: {d:?}");
    assert_eq!(left(&d, "tpm"), 1.0, "a check charges no token");
    assert!(
        limiter
            .check_costs(&who, "free", None, &tokens(1))
            .await
            .allowed
    );
    for costs in [Costs::new(), tokens(0)] {
        let d = limiter.check_costs(&who, "free", None, &costs).await;
        assert!(!d.allowed, "no token left: {costs:?} {d:?}");
        assert_eq!(d.refused_by().unwrap().name.as_ref(), "tpm");
        assert!(d.retry_after.is_some());
    }
    // The plain check of the middleware names no tokens either.
    assert!(!limiter.check(&who, "free", None).await.allowed);
    let after = peek(&limiter, &who).await;
    assert_eq!((left(&after, "rpm"), left(&after, "tpm")), (7.0, 0.0));

    // Reserve an estimate, settle what was used, per unit.
    let who = caller("free_c");
    let (d, r) = limiter
        .reserve_costs(&who, "free", None, &tokens(500))
        .await;
    assert!(d.allowed);
    let r = r.expect("a reservation");
    assert_eq!(r.primary_unit(), "tokens");
    assert_eq!(r.reserved(), 500);
    assert_eq!(r.reserved_costs().get("requests"), Some(1));
    let settled = r.settle_costs(&tokens(200)).await;
    assert_eq!(settled.len(), 1);
    assert_eq!(settled[0].1, Settled::Refunded(300));
    let after = peek(&limiter, &who).await;
    assert_eq!((left(&after, "rpm"), left(&after, "tpm")), (9.0, 800.0));
    // Nothing reserved in tokens: the whole usage is charged later.
    let (_, r) = limiter
        .reserve_costs(&who, "free", None, &Costs::new())
        .await;
    let r = r.unwrap();
    assert_eq!(r.reserved(), 0);
    assert_eq!(r.settle(250).await, Settled::Charged(250));
    let after = peek(&limiter, &who).await;
    assert_eq!((left(&after, "rpm"), left(&after, "tpm")), (8.0, 550.0));
    // A cancelled reservation gives every unit back.
    let (_, r) = limiter.reserve_costs(&who, "free", None, &tokens(50)).await;
    let both = r.unwrap().cancel().await;
    assert_eq!(both.len(), 2, "{both:?}");
    let after = peek(&limiter, &who).await;
    assert_eq!((left(&after, "rpm"), left(&after, "tpm")), (8.0, 550.0));
    limiter.shutdown().await;
}

#[tokio::test]
async fn each_limit_is_charged_in_its_own_unit_on_the_memory_store() {
    units_on(StoreSettings::default()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_limit_is_charged_in_its_own_unit_on_redis() {
    let server = RedisServer::start();
    units_on(redis(&server)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_limit_is_charged_in_its_own_unit_on_a_redis_cluster() {
    let c = RedisCluster::start();
    units_on(cluster(&c)).await;
}

#[tokio::test]
async fn a_request_costing_more_tokens_than_the_limit_holds_can_never_pass() {
    let limiter = Limiter::new(policy(StoreSettings::default()))
        .await
        .unwrap();
    let who = caller("free_d");
    let d = limiter.check_costs(&who, "free", None, &tokens(1001)).await;
    assert!(!d.allowed && d.retry_after.is_none());
    assert_eq!(d.exceeded_quota().unwrap().name.as_ref(), "tpm");
    let after = peek(&limiter, &who).await;
    assert_eq!((left(&after, "rpm"), left(&after, "tpm")), (10.0, 1000.0));
}

#[test]
fn a_unit_is_read_from_the_policy_file_and_checked() {
    let ok = r#"
[[tiers]]
name = "free"
limits = [
  { name = "rpm", algorithm = "sliding_window", limit = 60, window = "60s" },
  { name = "tpm", algorithm = "sliding_window", limit = 100000, window = "60s", unit = "tokens" },
  { name = "streams", algorithm = "concurrency", limit = 1 },
]

[[tiers]]
name = "anonymous"
limits = [{ name = "burst", algorithm = "token_bucket", capacity = 5, refill_per_second = 1 }]
"#;
    let p = Policy::from_toml_str(ok, Some("p.toml")).unwrap();
    let units: Vec<&str> = p.tiers[0].limits.iter().map(|l| l.unit.as_str()).collect();
    assert_eq!(units, ["requests", "tokens", "requests"]);

    for (bad, line, field) in [
        (
            ok.replace("unit = \"tokens\"", "unit = \"Tokens\""),
            6,
            "unit",
        ),
        (
            ok.replace(
                "unit = \"tokens\"",
                &format!("unit = \"{}\"", "t".repeat(33)),
            ),
            6,
            "unit",
        ),
        (ok.replace("unit = \"tokens\"", "unit = 3"), 6, "unit"),
        (
            ok.replace("limit = 1 }", "limit = 1, unit = \"tokens\" }"),
            7,
            "unit",
        ),
    ] {
        let err = Policy::from_toml_str(&bad, Some("p.toml"))
            .expect_err("invalid unit")
            .to_string();
        assert!(err.contains("p.toml"), "{err}");
        assert!(err.contains(&format!(":{line}")), "line {line}: {err}");
        assert!(err.contains(field), "{err}");
    }
}

#[test]
fn a_route_cost_above_a_tokens_limit_is_no_config_error() {
    // The route's cost counts requests; the tokens limit is asked for the
    // request's tokens.
    let p = Policy::builder()
        .tier(
            Tier::new("free")
                .limit(Limit::per_minute("rpm", 100))
                .limit(Limit::per_minute("tpm", 10).unit("tokens")),
        )
        .tier(Tier::new("anonymous").limit(Limit::per_minute("rpm", 100)))
        .route(RouteRule::new("POST", "/x").with_cost(50))
        .build();
    assert!(p.is_ok(), "{p:?}");
    let bad = Policy::builder()
        .tier(Tier::new("free").limit(Limit::per_minute("tpm", 10).unit("to-kens")))
        .tier(Tier::new("anonymous").limit(Limit::per_minute("rpm", 100)))
        .build()
        .expect_err("invalid unit")
        .to_string();
    assert!(bad.contains("tiers[0].limits[0].unit"), "{bad}");
}

/// Every algorithm but the in-flight one, with a quota of 3.
fn three_of_each(id: &str) -> Vec<ratewatch::store::Item> {
    use ratewatch::algorithm::Algorithm::*;
    let minute = 60_000_000;
    [
        TokenBucket {
            capacity: 3,
            refill_per_second: SLOW,
        },
        SlidingWindow {
            limit: 3,
            window_us: minute,
        },
        SlidingLog {
            limit: 3,
            window_us: minute,
        },
        FixedWindow {
            limit: 3,
            window_us: minute,
        },
        Gcra {
            rate_per_second: SLOW,
            burst: 3,
        },
        LeakyBucket {
            rate_per_second: SLOW,
            capacity: 3,
            max_delay_us: 0,
        },
    ]
    .into_iter()
    .enumerate()
    .map(|(i, a)| ratewatch::store::Item::new(support::identity_key(id, &format!("l{i}")), a))
    .collect()
}

/// A limit asked for 0 units with `require_left` admits while one unit is
/// left, writes nothing, and refuses at none left: on one store.
async fn a_check_that_something_is_left_on(store: std::sync::Arc<dyn ratewatch::store::Store>) {
    use ratewatch::store::Batch;
    for (i, item) in three_of_each("check-left").into_iter().enumerate() {
        let charged = [item.clone()];
        let checked = [item.clone().checking_left()];
        let plain = [item.clone().with_cost(0)];
        let d = store.decide(&Batch::consume(&charged, 2)).await.unwrap();
        assert!(d.allowed, "limit {i}");
        for _ in 0..3 {
            let d = store.decide(&Batch::consume(&checked, 1)).await.unwrap();
            assert!(d.allowed, "limit {i}: one unit left");
            assert_eq!(
                d.verdicts[0].remaining.floor(),
                1.0,
                "limit {i}: nothing charged"
            );
        }
        let d = store.decide(&Batch::consume(&charged, 1)).await.unwrap();
        assert!(
            d.allowed,
            "limit {i}: the unit the checks saw is still there"
        );
        let d = store.decide(&Batch::consume(&checked, 1)).await.unwrap();
        assert!(!d.allowed, "limit {i}: nothing left, the check refuses");
        assert_eq!(d.verdicts[0].remaining.floor(), 0.0);
        // A plain cost of 0 still only looks (the rate limit service's
        // "check only"): it admits at exactly none left.
        let d = store.decide(&Batch::consume(&plain, 1)).await.unwrap();
        assert!(d.allowed, "limit {i}: a plain zero cost looks");
    }
}

#[tokio::test]
async fn a_zero_cost_check_refuses_once_nothing_is_left_on_the_memory_store() {
    a_check_that_something_is_left_on(std::sync::Arc::new(ratewatch::store::MemoryStore::new()))
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zero_cost_check_refuses_once_nothing_is_left_on_redis() {
    let server = RedisServer::start();
    let store = ratewatch::store::RedisStore::connect(&redis(&server))
        .await
        .unwrap();
    a_check_that_something_is_left_on(std::sync::Arc::new(store)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zero_cost_check_refuses_once_nothing_is_left_on_a_redis_cluster() {
    let c = RedisCluster::start();
    let store = ratewatch::store::ClusterStore::connect(&cluster(&c))
        .await
        .unwrap();
    a_check_that_something_is_left_on(std::sync::Arc::new(store)).await;
}

mod headers {
    use super::*;
    use axum::Router;
    use axum::body::Body;
    use axum::routing::post;
    use http::{Request, Response, StatusCode};
    use tower::ServiceExt;

    fn app(limiter: &Limiter) -> Router {
        Router::new()
            .route("/v1/chat", post(|| async { "ok" }))
            .layer(limiter.layer().with_costs(|parts| {
                let n = parts
                    .headers
                    .get("x-max-tokens")?
                    .to_str()
                    .ok()?
                    .parse()
                    .ok()?;
                Some(Costs::new().with("tokens", n))
            }))
    }

    async fn call(app: &Router, tokens: Option<u64>) -> Response<Body> {
        let mut req = Request::post("/v1/chat").header("x-api-key", "free_h");
        if let Some(n) = tokens {
            req = req.header("x-max-tokens", n.to_string());
        }
        app.clone()
            .oneshot(req.body(Body::empty()).unwrap())
            .await
            .unwrap()
    }

    fn header<'a>(res: &'a Response<Body>, name: &str) -> &'a str {
        res.headers()
            .get(name)
            .unwrap_or_else(|| panic!("no {name}: {:?}", res.headers()))
            .to_str()
            .unwrap()
    }

    #[tokio::test]
    async fn every_unit_the_decision_touched_has_its_own_headers_and_a_429_names_the_tokens_limit()
    {
        let limiter = Limiter::new(
            Policy::builder()
                .tier(
                    Tier::new("free")
                        .match_prefix("free_")
                        .limit(Limit::token_bucket("rpm", 10, SLOW))
                        .limit(Limit::token_bucket("tpm", 1000, SLOW).unit("tokens")),
                )
                .tier(Tier::new("anonymous").limit(Limit::per_second("burst", 5)))
                .build()
                .unwrap(),
        )
        .await
        .unwrap();
        let app = app(&limiter);
        let res = call(&app, Some(300)).await;
        assert_eq!(res.status(), StatusCode::OK);
        assert_eq!(header(&res, "x-ratelimit-limit-requests"), "10");
        assert_eq!(header(&res, "x-ratelimit-remaining-requests"), "9");
        assert_eq!(header(&res, "x-ratelimit-limit-tokens"), "1000");
        assert_eq!(header(&res, "x-ratelimit-remaining-tokens"), "700");
        let reset: u64 = header(&res, "x-ratelimit-reset-tokens").parse().unwrap();
        assert!(reset > 1_700_000_000, "an epoch second: {reset}");
        // X-RateLimit-* stay the requests unit.
        assert_eq!(header(&res, "x-ratelimit-limit"), "10");
        assert_eq!(header(&res, "x-ratelimit-remaining"), "9");
        assert_eq!(
            header(&res, "ratelimit-policy"),
            "\"rpm\";q=10;w=10000000, \"tpm\";q=1000;w=1000000000;qu=\"tokens\""
        );
        let ratelimit = header(&res, "ratelimit");
        assert!(ratelimit.starts_with("\"rpm\";r=9;t="), "{ratelimit}");
        assert!(ratelimit.contains(", \"tpm\";r=700;t="), "{ratelimit}");

        // Refused by the tokens: the body names tpm, its headers say 0.
        let res = call(&app, Some(701)).await;
        assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(header(&res, "x-ratelimit-remaining-tokens"), "700");
        assert_eq!(header(&res, "x-ratelimit-remaining-requests"), "9");
        assert!(res.headers().contains_key("retry-after"));
        let body = axum::body::to_bytes(res.into_body(), 1 << 16)
            .await
            .unwrap();
        let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(body["limit"], "tpm", "{body}");
        assert_eq!(body["unit"], "tokens", "{body}");
        // Nothing was charged by the refusal.
        let res = call(&app, Some(700)).await;
        assert_eq!(res.status(), StatusCode::OK);
        assert_eq!(header(&res, "x-ratelimit-remaining-requests"), "8");
        assert_eq!(header(&res, "x-ratelimit-remaining-tokens"), "0");
        // No tokens left: a request naming none is refused by tpm too.
        let res = call(&app, None).await;
        assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(header(&res, "x-ratelimit-remaining-tokens"), "0");
    }

    #[tokio::test]
    async fn a_one_unit_decision_sends_the_requests_family_beside_x_ratelimit() {
        let limiter = Limiter::new(
            Policy::builder()
                .tier(Tier::new("free").limit(Limit::token_bucket("burst", 5, SLOW)))
                .tier(Tier::new("anonymous").limit(Limit::per_second("burst", 5)))
                .build()
                .unwrap(),
        )
        .await
        .unwrap();
        let app = Router::new()
            .route("/v1/chat", post(|| async { "ok" }))
            .layer(limiter.layer());
        let res = call(&app, None).await;
        assert_eq!(res.status(), StatusCode::OK);
        for family in ["limit", "remaining", "reset"] {
            assert_eq!(
                header(&res, &format!("x-ratelimit-{family}-requests")),
                header(&res, &format!("x-ratelimit-{family}")),
            );
        }
        assert_eq!(header(&res, "x-ratelimit-remaining-requests"), "4");
        assert!(!res.headers().contains_key("x-ratelimit-remaining-tokens"));
        assert_eq!(header(&res, "ratelimit-policy"), "\"burst\";q=5;w=5000000");
    }
}

mod settle {
    use super::*;
    use axum::Router;
    use axum::body::Body;
    use axum::routing::post;
    use http::{Request, StatusCode};
    use ratewatch::{Meter, UnitUsage, Usage};
    use tower::ServiceExt;

    fn limiter_policy(refund_on_error: bool) -> Policy {
        Policy::builder()
            .tier(
                Tier::new("free")
                    .match_prefix("free_")
                    .limit(Limit::token_bucket("rpm", 10, SLOW))
                    .limit(Limit::token_bucket("tpm", 1000, SLOW).unit("tokens")),
            )
            .tier(Tier::new("anonymous").limit(Limit::per_second("burst", 5)))
            .route(RouteRule::new("POST", "/strict").with_refund_on_error(refund_on_error))
            .build()
            .unwrap()
    }

    fn app(limiter: &Limiter) -> Router {
        let handler = |axum::Extension(meter): axum::Extension<Meter>, body: String| async move {
            match body.as_str() {
                "fail" => (StatusCode::BAD_REQUEST, "no").into_response(),
                "fail-used" => {
                    meter.record(40);
                    (StatusCode::BAD_GATEWAY, "upstream died after 40").into_response()
                }
                "units" => {
                    let mut res = "ok".into_response();
                    res.extensions_mut().insert(UnitUsage(
                        Costs::new().with("tokens", 120).with("requests", 1),
                    ));
                    res
                }
                "primary" => {
                    let mut res = "ok".into_response();
                    res.extensions_mut().insert(Usage(50));
                    res
                }
                _ => "ok".into_response(),
            }
        };
        use axum::response::IntoResponse;
        Router::new()
            .route("/chat", post(handler))
            .route("/strict", post(handler))
            .layer(
                limiter
                    .layer()
                    .with_costs(|_| Some(Costs::new().with("tokens", 300))),
            )
    }

    async fn post_to(app: &Router, path: &str, body: &'static str) -> StatusCode {
        let req = Request::post(path)
            .header("x-api-key", "free_s")
            .body(Body::from(body))
            .unwrap();
        app.clone().oneshot(req).await.unwrap().status()
    }

    /// Waits (settles run in the background) until rpm and tpm have
    /// `want` left.
    async fn settles_to(limiter: &Limiter, want: (f64, f64)) {
        let who = caller("free_s");
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let d = peek(limiter, &who).await;
            let have = (left(&d, "rpm"), left(&d, "tpm"));
            if have == want {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{have:?}, want {want:?}"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    #[tokio::test]
    async fn a_request_refused_downstream_gets_its_whole_reservation_back() {
        let limiter = Limiter::new(limiter_policy(true)).await.unwrap();
        let app = app(&limiter);
        assert_eq!(
            post_to(&app, "/chat", "fail").await,
            StatusCode::BAD_REQUEST
        );
        settles_to(&limiter, (10.0, 1000.0)).await;
        // What was recorded is settled as recorded, error or not.
        assert_eq!(
            post_to(&app, "/chat", "fail-used").await,
            StatusCode::BAD_GATEWAY
        );
        settles_to(&limiter, (9.0, 960.0)).await;
        // A success with nothing recorded keeps its reservation.
        assert_eq!(post_to(&app, "/chat", "ok").await, StatusCode::OK);
        settles_to(&limiter, (8.0, 660.0)).await;
    }

    #[tokio::test]
    async fn a_route_may_keep_the_reservation_of_a_request_refused_downstream() {
        let limiter = Limiter::new(limiter_policy(false)).await.unwrap();
        let app = app(&limiter);
        assert_eq!(
            post_to(&app, "/strict", "fail").await,
            StatusCode::BAD_REQUEST
        );
        // Elsewhere the refund still applies, and proves settles ran.
        assert_eq!(
            post_to(&app, "/chat", "fail").await,
            StatusCode::BAD_REQUEST
        );
        settles_to(&limiter, (9.0, 700.0)).await;
    }

    #[tokio::test]
    async fn usage_is_settled_per_unit_and_a_bare_usage_means_the_tokens() {
        let limiter = Limiter::new(limiter_policy(true)).await.unwrap();
        let app = app(&limiter);
        assert_eq!(post_to(&app, "/chat", "units").await, StatusCode::OK);
        settles_to(&limiter, (9.0, 880.0)).await;
        // `Usage` counts the reservation's primary unit: tokens here.
        assert_eq!(post_to(&app, "/chat", "primary").await, StatusCode::OK);
        settles_to(&limiter, (8.0, 830.0)).await;
    }

    #[test]
    fn refund_on_error_is_read_from_the_policy_file() {
        let text = |v: &str| {
            format!(
                r#"
[[tiers]]
name = "anonymous"
limits = [{{ name = "burst", algorithm = "token_bucket", capacity = 5, refill_per_second = 1 }}]
[[tiers]]
name = "free"
limits = [{{ name = "burst", algorithm = "token_bucket", capacity = 5, refill_per_second = 1 }}]
[[routes]]
path = "/x"
{v}
"#
            )
        };
        let p = Policy::from_toml_str(&text(""), None).unwrap();
        assert!(p.routes[0].refund_on_error);
        let p = Policy::from_toml_str(&text("refund_on_error = false"), None).unwrap();
        assert!(!p.routes[0].refund_on_error);
        let err = Policy::from_toml_str(&text("refund_on_error = \"no\""), Some("p.toml"))
            .expect_err("not a bool")
            .to_string();
        assert!(
            err.contains("p.toml:10") && err.contains("refund_on_error"),
            "{err}"
        );
    }
}

mod estimates {
    use super::*;
    use axum::Router;
    use axum::body::Body;
    use axum::routing::post;
    use http::{Request, StatusCode};
    use ratewatch::Meter;
    use tower::ServiceExt;

    const POLICY: &str = r#"
[[tiers]]
name = "free"
match_prefix = "free_"
limits = [
  { name = "rpm", algorithm = "token_bucket", capacity = 10, refill_per_second = 0.000001 },
  { name = "tpm", algorithm = "token_bucket", capacity = 1000, refill_per_second = 0.000001, unit = "tokens" },
  { name = "upload", algorithm = "token_bucket", capacity = 100, refill_per_second = 0.000001, unit = "bytes" },
]

[[tiers]]
name = "anonymous"
limits = [{ name = "burst", algorithm = "token_bucket", capacity = 5, refill_per_second = 1 }]

[[routes]]
method = "POST"
path = "/v1/chat"
costs = [
  { unit = "tokens", header = "x-max-tokens" },
  { unit = "bytes", content_length = true },
]
"#;

    async fn send(
        app: &Router,
        max_tokens: Option<&str>,
        body: &'static str,
    ) -> (StatusCode, String, String) {
        let mut req = Request::post("/v1/chat")
            .header("x-api-key", "free_e")
            .header("content-length", body.len().to_string());
        if let Some(n) = max_tokens {
            req = req.header("x-max-tokens", n);
        }
        let res = app
            .clone()
            .oneshot(req.body(Body::from(body)).unwrap())
            .await
            .unwrap();
        let get = |n: &str| {
            res.headers()
                .get(n)
                .map_or_else(String::new, |v| v.to_str().unwrap().to_owned())
        };
        let (t, b) = (
            get("x-ratelimit-remaining-tokens"),
            get("x-ratelimit-remaining-bytes"),
        );
        (res.status(), t, b)
    }

    #[tokio::test]
    async fn a_route_reads_the_tokens_from_a_header_and_the_bytes_from_the_content_length() {
        let policy = Policy::from_toml_str(POLICY, Some("p.toml")).unwrap();
        let limiter = Limiter::new(policy).await.unwrap();
        // A plain layer: the route's estimates meter the request.
        let app = Router::new()
            .route(
                "/v1/chat",
                post(
                    |axum::Extension(meter): axum::Extension<Meter>| async move {
                        assert_eq!(meter.primary_unit(), "tokens");
                        assert_eq!(meter.reserved(), 400);
                        meter.record(400);
                        "ok"
                    },
                ),
            )
            .layer(limiter.layer());
        let ok = send(&app, Some("400"), "0123456789").await;
        assert_eq!(ok, (StatusCode::OK, "600".into(), "90".into()));
        // More tokens than are left: refused, nothing charged.
        let refused = send(&app, Some("601"), "0123456789").await;
        assert_eq!(refused.0, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!((refused.1.as_str(), refused.2.as_str()), ("600", "90"));
        // The refusal charged no request either.
        let d = limiter
            .peek(
                &caller("free_e"),
                "free",
                limiter.route_for("POST", "/v1/chat"),
            )
            .await;
        assert_eq!(left(&d, "rpm"), 9.0);
        drop(d);
    }

    #[test]
    fn a_cost_estimate_is_checked_with_file_line_and_field() {
        for (from, to, field) in [
            (
                "{ unit = \"tokens\", header = \"x-max-tokens\" }",
                "{ unit = \"requests\", header = \"x-max-tokens\" }",
                "unit",
            ),
            (
                "{ unit = \"tokens\", header = \"x-max-tokens\" }",
                "{ unit = \"tokens\", header = \"x max\" }",
                "header",
            ),
            (
                "{ unit = \"tokens\", header = \"x-max-tokens\" }",
                "{ unit = \"tokens\", header = \"x-max-tokens\", content_length = true }",
                "content_length",
            ),
            (
                "{ unit = \"tokens\", header = \"x-max-tokens\" }",
                "{ unit = \"tokens\", body = \"max_tokens\" }",
                "body",
            ),
        ] {
            let err = Policy::from_toml_str(&POLICY.replace(from, to), Some("p.toml"))
                .expect_err(to)
                .to_string();
            assert!(err.contains("p.toml:19"), "{err}");
            assert!(err.contains(field), "{err}");
        }
    }

    const JSON_POLICY: &str = r#"
[[tiers]]
name = "free"
match_prefix = "free_"
limits = [
  { name = "rpm", algorithm = "token_bucket", capacity = 10, refill_per_second = 0.000001 },
  { name = "tpm", algorithm = "token_bucket", capacity = 1000, refill_per_second = 0.000001, unit = "tokens" },
]

[[tiers]]
name = "anonymous"
limits = [{ name = "burst", algorithm = "token_bucket", capacity = 5, refill_per_second = 1 }]

[[routes]]
method = "POST"
path = "/v1/chat"
max_body_bytes = 64
costs = [{ unit = "tokens", json = "options.max_tokens" }]
"#;

    async fn chat(app: &Router, body: String, declared: Option<usize>) -> (StatusCode, String) {
        let mut req = Request::post("/v1/chat").header("x-api-key", "free_j");
        if let Some(n) = declared {
            req = req.header("content-length", n.to_string());
        }
        let res = app
            .clone()
            .oneshot(req.body(Body::from(body)).unwrap())
            .await
            .unwrap();
        let status = res.status();
        let left = res
            .headers()
            .get("x-ratelimit-remaining-tokens")
            .map_or_else(String::new, |v| v.to_str().unwrap().to_owned());
        let body = axum::body::to_bytes(res.into_body(), 1 << 16)
            .await
            .unwrap();
        if status == StatusCode::OK {
            // The handler echoes the body it was given.
            return (status, format!("{left} {}", String::from_utf8_lossy(&body)));
        }
        (status, String::from_utf8_lossy(&body).into_owned())
    }

    #[tokio::test]
    async fn a_route_reads_the_tokens_from_a_json_body_field_within_a_bound() {
        let policy = Policy::from_toml_str(JSON_POLICY, Some("p.toml")).unwrap();
        let limiter = Limiter::new(policy).await.unwrap();
        let app = Router::new()
            .route("/v1/chat", post(|body: String| async move { body }))
            .layer(limiter.layer())
            .layer(limiter.body_costs_layer());
        let body = r#"{"options":{"max_tokens":600}}"#.to_owned();
        let (status, said) = chat(&app, body.clone(), Some(body.len())).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(said, format!("400 {body}"), "charged 600, body intact");
        let (status, _) = chat(&app, body.clone(), None).await;
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "600 > 400 left");
        // Not JSON: no tokens named, checked without charge.
        let (status, said) = chat(&app, "hello".into(), None).await;
        assert_eq!((status, said.as_str()), (StatusCode::OK, "400 hello"));
        // Over the bound, declared or as it arrives: 413, nothing charged.
        let long = format!(
            r#"{{"options":{{"max_tokens":1}},"pad":"{}"}}"#,
            "x".repeat(64)
        );
        let (status, said) = chat(&app, long.clone(), Some(long.len())).await;
        assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{said}");
        assert!(said.contains("body_too_large"), "{said}");
        let (status, _) = chat(&app, long, None).await;
        assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
        let d = limiter
            .peek(
                &caller("free_j"),
                "free",
                limiter.route_for("POST", "/v1/chat"),
            )
            .await;
        assert_eq!((left(&d, "rpm"), left(&d, "tpm")), (8.0, 400.0));
    }
}

mod conditions {
    use super::*;
    use axum::Router;
    use axum::body::Body;
    use axum::routing::post;
    use http::{Request, StatusCode};
    use tower::ServiceExt;

    const POLICY: &str = r#"
[[tiers]]
name = "free"
match_prefix = "free_"
limits = [{ name = "rpm", algorithm = "token_bucket", capacity = 100, refill_per_second = 0.000001 }]

[[tiers]]
name = "pro"
match_prefix = "pro_"
limits = [{ name = "rpm", algorithm = "token_bucket", capacity = 100, refill_per_second = 0.000001 }]

[[tiers]]
name = "anonymous"
limits = [{ name = "burst", algorithm = "token_bucket", capacity = 50, refill_per_second = 1 }]

[[routes]]
method = "POST"
path = "/v1/chat"
when = [{ json = "stream", equals = true }]
limits = [
  { name = "streams", algorithm = "concurrency", limit = 1, tier = "free" },
  { name = "streams", algorithm = "concurrency", limit = 2, tier = "pro" },
]

[[routes]]
method = "POST"
path = "/v1/chat"
when = [{ header = "x-priority", equals = "low" }]
cost = 50

[[routes]]
method = "POST"
path = "/v1/chat"
"#;

    #[tokio::test]
    async fn a_route_rule_matches_a_json_field_or_a_header_and_carries_limits_per_tier() {
        let policy = Policy::from_toml_str(POLICY, Some("p.toml")).unwrap();
        let limiter = Limiter::new(policy).await.unwrap();
        // The handler answers at once: the response body holds the slot
        // until it is dropped, so responses kept alive keep their slots.
        let app = Router::new()
            .route("/v1/chat", post(|body: String| async move { body }))
            .layer(limiter.layer())
            .layer(limiter.body_costs_layer());
        let send = |key: &'static str, body: &'static str, priority: Option<&'static str>| {
            let app = app.clone();
            async move {
                let mut req = Request::post("/v1/chat").header("x-api-key", key);
                if let Some(p) = priority {
                    req = req.header("x-priority", p);
                }
                app.oneshot(req.body(Body::from(body)).unwrap())
                    .await
                    .unwrap()
            }
        };
        let stream = r#"{"stream": true}"#;
        let held = send("free_c", stream, None).await;
        assert_eq!(held.status(), StatusCode::OK);
        assert_eq!(
            send("free_c", stream, None).await.status(),
            StatusCode::TOO_MANY_REQUESTS,
            "one stream at once on free"
        );
        // Not a stream: no stream limit.
        let plain = send("free_c", r#"{"stream": false}"#, None).await;
        assert_eq!(plain.status(), StatusCode::OK);
        assert_eq!(
            plain.headers()["x-ratelimit-remaining"],
            "98",
            "the refusal charged nothing"
        );
        // Two at once on pro.
        let p1 = send("pro_c", stream, None).await;
        let p2 = send("pro_c", stream, None).await;
        assert_eq!((p1.status(), p2.status()), (StatusCode::OK, StatusCode::OK));
        assert_eq!(
            send("pro_c", stream, None).await.status(),
            StatusCode::TOO_MANY_REQUESTS
        );
        // A header condition picks the costlier rule.
        let low = send("free_c", "{}", Some("LOW")).await;
        assert_eq!(low.status(), StatusCode::OK);
        assert_eq!(low.headers()["x-ratelimit-remaining"], "48");
        drop(held);
        assert_eq!(send("free_c", stream, None).await.status(), StatusCode::OK);
        // Without the request (method and path only), no conditional rule
        // matches: the last rule does.
        let r = limiter.route_for("POST", "/v1/chat").unwrap();
        assert!(r.rule().when.is_empty());
    }

    #[test]
    fn a_route_limit_for_an_unknown_tier_or_a_tier_limit_naming_a_tier_is_refused() {
        let unknown = POLICY.replace("tier = \"pro\"", "tier = \"gold\"");
        let err = Policy::from_toml_str(&unknown, Some("p.toml"))
            .expect_err("unknown tier")
            .to_string();
        assert!(err.contains("p.toml:22") && err.contains("gold"), "{err}");
        let on_tier = POLICY.replacen(
            "refill_per_second = 0.000001 }",
            "refill_per_second = 0.000001, tier = \"free\" }",
            1,
        );
        let err = Policy::from_toml_str(&on_tier, Some("p.toml"))
            .expect_err("tier on a tier limit")
            .to_string();
        assert!(err.contains("p.toml:5") && err.contains("tier"), "{err}");
        let bad = POLICY.replace("equals = true", "equals = 1.5");
        let err = Policy::from_toml_str(&bad, Some("p.toml"))
            .expect_err("a float")
            .to_string();
        assert!(err.contains("p.toml:19") && err.contains("equals"), "{err}");
    }
}

#[test]
fn units_charged_refunded_and_settled_are_counted_per_tier_and_unit() {
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    metrics::with_local_recorder(&recorder, || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(async {
                let limiter = Limiter::new(policy(StoreSettings::default()))
                    .await
                    .unwrap();
                let who = caller("free_m");
                let (_, r) = limiter
                    .reserve_costs(&who, "free", None, &tokens(300))
                    .await;
                let settled = r.unwrap().settle_costs(&tokens(100)).await;
                assert_eq!(settled[0].1, Settled::Refunded(200));
                let (_, r) = limiter.reserve_costs(&who, "free", None, &tokens(10)).await;
                assert_eq!(r.unwrap().settle(60).await, Settled::Charged(50));
            });
    });
    let text = handle.render();
    for line in [
        r#"ratewatch_units_charged_total{tier="free",unit="tokens"} 310"#,
        r#"ratewatch_units_charged_total{tier="free",unit="requests"} 2"#,
        r#"ratewatch_units_refunded_total{tier="free",unit="tokens"} 200"#,
        r#"ratewatch_units_settled_total{tier="free",unit="tokens"} 50"#,
        // Every tier's units exist at zero from the start.
        r#"ratewatch_units_settled_total{tier="free",unit="requests"} 0"#,
        r#"ratewatch_units_charged_total{tier="anonymous",unit="requests"} 0"#,
    ] {
        assert!(text.contains(line), "{line} in\n{text}");
    }
    // Labels come from the policy: no tier has a unit it does not count.
    assert!(
        !text.contains(r#"tier="anonymous",unit="tokens""#),
        "{text}"
    );
}
