//! The middleware and the server's routes as a client sees them: status
//! codes, headers a structured-field parser accepts, JSON bodies.

use std::sync::Arc;

use axum::Router;
use axum::body::{Body, to_bytes};
use axum::response::Response;
use http::Request;
use ratewatch::clock::ManualClock;
use ratewatch::policy::{AnonymousMode, IdentitySettings, Limit, Policy, RouteRule, Scope, Tier};
use ratewatch::{Limiter, server};
use tower::ServiceExt;

const T0: u64 = 1_800_000_000_000_000;

fn policy() -> Policy {
    Policy::builder()
        .tier(
            Tier::new("free")
                .match_prefix("free_")
                .limit(Limit::token_bucket("burst", 10, 0.33))
                .limit(Limit::sliding_window(
                    "minute",
                    20,
                    std::time::Duration::from_secs(60),
                ))
                .limit(Limit::fixed_window(
                    "day",
                    1000,
                    std::time::Duration::from_secs(86_400),
                ))
                .limit(Limit::token_bucket("trial", 3, 0.01).shadow()),
        )
        .tier(
            Tier::new("pro")
                .match_prefix("pro_")
                .limit(Limit::token_bucket("burst", 100, 10.0)),
        )
        .tier(
            Tier::new("anonymous")
                .limit(Limit::token_bucket("burst", 30, 1.0))
                .limit(Limit::token_bucket("ip_burst", 40, 1.0).with_scope(Scope::Ip)),
        )
        .route(RouteRule::new("POST", "/api/export").with_cost(5))
        .build()
        .expect("valid policy")
}

async fn app_with(policy: Policy) -> (Router, ManualClock) {
    let clock = ManualClock::new(T0);
    let limiter = Limiter::builder(policy)
        .with_clock(Arc::new(clock.clone()))
        .build()
        .await
        .expect("limiter");
    (server::app(limiter), clock)
}

async fn send(app: &Router, method: &str, path: &str, key: Option<&str>) -> Response {
    let mut req = Request::builder().method(method).uri(path);
    if let Some(k) = key {
        req = req.header("x-api-key", k);
    }
    app.clone()
        .oneshot(req.body(Body::empty()).unwrap())
        .await
        .unwrap()
}

fn header<'a>(res: &'a Response, name: &str) -> &'a str {
    res.headers()
        .get(name)
        .unwrap_or_else(|| panic!("missing {name}"))
        .to_str()
        .unwrap()
}

async fn json(res: Response) -> serde_json::Value {
    let bytes = to_bytes(res.into_body(), 1 << 20).await.unwrap();
    serde_json::from_slice(&bytes).unwrap()
}

/// Parses a structured-field list and returns (name, params) per member.
fn sf_list(value: &str) -> Vec<(String, Vec<(String, i64)>)> {
    use sfv::{BareItem, ListEntry, Parser};
    let list = Parser::new(value)
        .parse::<sfv::List>()
        .expect("a valid structured-field list");
    list.into_iter()
        .map(|entry| match entry {
            ListEntry::Item(item) => {
                let name = match item.bare_item {
                    BareItem::String(s) => s.as_str().to_owned(),
                    other => panic!("member is not a string: {other:?}"),
                };
                let params = item
                    .params
                    .into_iter()
                    .map(|(k, v)| {
                        (
                            k.as_str().to_owned(),
                            v.as_integer().map(i64::from).expect("integer param"),
                        )
                    })
                    .collect();
                (name, params)
            }
            ListEntry::InnerList(_) => panic!("unexpected inner list"),
        })
        .collect()
}

#[tokio::test]
async fn a_fresh_free_key_gets_ten_requests_then_429_while_a_pro_key_keeps_passing() {
    let (app, _) = app_with(policy()).await;
    for i in 0..10 {
        let res = send(&app, "GET", "/api/users", Some("free_alice")).await;
        assert_eq!(res.status(), 200, "request {i}");
        assert_eq!(header(&res, "x-ratelimit-remaining"), (9 - i).to_string());
    }
    let res = send(&app, "GET", "/api/users", Some("free_alice")).await;
    assert_eq!(res.status(), 429);
    let retry: u64 = header(&res, "retry-after").parse().unwrap();
    assert_eq!(retry, 4, "one token at 0.33/s takes 3.03 s, rounded up");
    let rl = sf_list(header(&res, "ratelimit"));
    assert_eq!(rl[0].0, "burst");
    assert_eq!(rl[0].1, vec![("r".into(), 0), ("t".into(), 4)]);
    let body = json(res).await;
    assert_eq!(body["tier"], "free");
    assert_eq!(body["limit"], "burst");
    assert_eq!(body["retry_after_seconds"], 4);

    for _ in 0..50 {
        assert_eq!(
            send(&app, "GET", "/api/users", Some("pro_bob"))
                .await
                .status(),
            200
        );
    }
}

#[tokio::test]
async fn policy_header_names_every_enforced_limit_and_parses_as_structured_fields() {
    let (app, _) = app_with(policy()).await;
    let res = send(&app, "GET", "/api/users", Some("free_carol")).await;
    let policy = sf_list(header(&res, "ratelimit-policy"));
    let names: Vec<&str> = policy.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        ["burst", "minute", "day"],
        "shadow limits are not advertised"
    );
    assert_eq!(policy[0].1, vec![("q".into(), 10), ("w".into(), 31)]);
    assert_eq!(policy[1].1, vec![("q".into(), 20), ("w".into(), 60)]);
    assert_eq!(policy[2].1, vec![("q".into(), 1000), ("w".into(), 86_400)]);
    let reset: u64 = header(&res, "x-ratelimit-reset").parse().unwrap();
    assert!(reset > T0 / 1_000_000 && reset <= T0 / 1_000_000 + 31);
    assert_eq!(header(&res, "x-ratelimit-limit"), "10");
}

#[tokio::test]
async fn health_is_never_limited() {
    let (app, _) = app_with(policy()).await;
    for _ in 0..200 {
        let res = send(&app, "GET", "/health", Some("free_dave")).await;
        assert_eq!(res.status(), 200);
        assert!(res.headers().get("ratelimit").is_none());
    }
}

#[tokio::test]
async fn quota_returns_at_the_refill_rate() {
    let (app, clock) = app_with(policy()).await;
    for _ in 0..10 {
        send(&app, "GET", "/api/users", Some("free_erin")).await;
    }
    assert_eq!(
        send(&app, "GET", "/api/users", Some("free_erin"))
            .await
            .status(),
        429
    );
    clock.advance(std::time::Duration::from_millis(3_031));
    assert_eq!(
        send(&app, "GET", "/api/users", Some("free_erin"))
            .await
            .status(),
        200
    );
    assert_eq!(
        send(&app, "GET", "/api/users", Some("free_erin"))
            .await
            .status(),
        429
    );
}

#[tokio::test]
async fn export_costs_five_units() {
    let (app, _) = app_with(policy()).await;
    assert_eq!(
        send(&app, "POST", "/api/export", Some("free_frank"))
            .await
            .status(),
        200
    );
    let res = send(&app, "POST", "/api/export", Some("free_frank")).await;
    assert_eq!(res.status(), 200);
    assert_eq!(header(&res, "x-ratelimit-remaining"), "0");
    assert_eq!(
        send(&app, "POST", "/api/export", Some("free_frank"))
            .await
            .status(),
        429
    );
}

#[tokio::test]
async fn a_shadow_limit_reports_but_never_blocks() {
    let limiter = Limiter::new(policy()).await.unwrap();
    let caller = ratewatch::Identity::new(ratewatch::identity::IdentityKind::ApiKey, "free_gina");
    // The shadow `trial` limit holds 3; the enforced burst holds 10.
    let mut outcomes = Vec::new();
    for _ in 0..10 {
        let d = limiter.check(&caller, "free", None).await;
        assert!(d.allowed, "a shadow limit never blocks");
        outcomes.push(d.outcome);
    }
    use ratewatch::telemetry::Outcome::{Allowed, ShadowBlocked};
    assert_eq!(outcomes[..3], [Allowed; 3]);
    assert_eq!(
        outcomes[3..],
        [ShadowBlocked; 7],
        "but it says it would have"
    );
    let (app, _) = app_with(policy()).await;
    for _ in 0..10 {
        assert_eq!(
            send(&app, "GET", "/api/users", Some("free_gina"))
                .await
                .status(),
            200
        );
    }
}

#[tokio::test]
async fn reset_is_the_epoch_second_at_or_after_which_the_request_passes() {
    let (app, _) = app_with(policy()).await;
    for _ in 0..10 {
        send(&app, "GET", "/api/users", Some("free_reset")).await;
    }
    let res = send(&app, "GET", "/api/users", Some("free_reset")).await;
    assert_eq!(res.status(), 429);
    // One token at 0.33/s is back 3.0303 s after T0 (a whole second):
    // the reset second is T0 + 4, never T0 + 3.
    let reset: u64 = header(&res, "x-ratelimit-reset").parse().unwrap();
    assert_eq!(reset, T0 / 1_000_000 + 4);
}

#[tokio::test]
async fn looking_at_the_status_is_itself_limited_per_caller() {
    let (app, _) = app_with(policy()).await;
    let mut codes = Vec::new();
    for _ in 0..30 {
        codes.push(
            send(&app, "GET", "/api/ratelimit/status", Some("free_looker"))
                .await
                .status()
                .as_u16(),
        );
    }
    assert_eq!(
        codes.iter().filter(|c| **c == 200).count(),
        20,
        "a burst of 20 looks"
    );
    assert!(codes[20..].iter().all(|c| *c == 429));
    assert_eq!(
        send(&app, "GET", "/api/ratelimit/status", Some("free_other"))
            .await
            .status(),
        200,
        "another caller still looks"
    );
}

#[tokio::test]
async fn status_looks_from_one_ipv6_network_share_one_allowance_whatever_keys_they_invent() {
    // One host holds a whole /64: fresh addresses and fresh keys must not
    // buy fresh looks (each look is a store read).
    use axum::extract::ConnectInfo;
    let (app, _) = app_with(policy()).await;
    let mut ok = 0;
    for i in 0..60 {
        let mut req = Request::get("/api/ratelimit/status")
            .header("x-api-key", format!("free_invented_{i}"))
            .body(Body::empty())
            .unwrap();
        let peer: std::net::SocketAddr =
            format!("[2001:db8:7:7::{:x}]:4000", i + 1).parse().unwrap();
        req.extensions_mut().insert(ConnectInfo(peer));
        if app.clone().oneshot(req).await.unwrap().status() == 200 {
            ok += 1;
        }
    }
    // A burst of 20, and 5 more a second for however slow this machine is.
    assert!(ok < 45, "{ok} of 60 looks passed from one /64");
}

#[tokio::test]
async fn status_reports_quota_without_consuming_it() {
    let (app, _) = app_with(policy()).await;
    send(&app, "GET", "/api/users", Some("free_hank")).await;
    for _ in 0..5 {
        let res = send(&app, "GET", "/api/ratelimit/status", Some("free_hank")).await;
        assert_eq!(res.status(), 200);
        let body = json(res).await;
        assert_eq!(body["tier"], "free");
        let burst = &body["limits"][0];
        assert_eq!(burst["name"], "burst");
        assert_eq!(burst["remaining"], 9);
        assert!(
            !body.to_string().contains("free_hank"),
            "the raw key is never echoed"
        );
    }
}

#[tokio::test]
async fn malformed_or_oversized_keys_get_a_400_with_a_reason() {
    let (app, _) = app_with(policy()).await;
    let long = "k".repeat(5000);
    for key in [long.as_str(), "two words"] {
        let res = send(&app, "GET", "/api/users", Some(key)).await;
        assert_eq!(res.status(), 400);
        let body = json(res).await;
        assert_eq!(body["error"], "bad_identity");
    }
    let req = Request::get("/api/users")
        .header(
            "x-api-key",
            http::HeaderValue::from_bytes(b"caf\xe9").unwrap(),
        )
        .body(Body::empty())
        .unwrap();
    assert_eq!(app.clone().oneshot(req).await.unwrap().status(), 400);
}

#[tokio::test]
async fn anonymous_callers_are_rejected_with_401_when_keys_are_required() {
    let p = Policy::builder()
        .identity(IdentitySettings {
            anonymous: AnonymousMode::Reject,
            ..Default::default()
        })
        .tier(Tier::new("free").limit(Limit::per_second("burst", 5)))
        .tier(Tier::new("anonymous").limit(Limit::per_second("burst", 5)))
        .build()
        .unwrap();
    let (app, _) = app_with(p).await;
    let res = send(&app, "GET", "/api/users", None).await;
    assert_eq!(res.status(), 401);
    assert_eq!(json(res).await["error"], "api_key_required");
}

#[tokio::test]
async fn bearer_tokens_identify_callers() {
    let (app, _) = app_with(policy()).await;
    let req = || {
        Request::get("/api/users")
            .header("authorization", "Bearer pro_token_1")
            .body(Body::empty())
            .unwrap()
    };
    let res = app.clone().oneshot(req()).await.unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(header(&res, "x-ratelimit-limit"), "100");
}

#[tokio::test]
async fn the_layer_also_works_as_a_route_layer() {
    let limiter = Limiter::new(policy()).await.unwrap();
    let app: Router = Router::new()
        .route("/limited", axum::routing::get(|| async { "x" }))
        .route_layer(limiter.layer())
        .route("/free", axum::routing::get(|| async { "y" }));
    for _ in 0..10 {
        send(&app, "GET", "/limited", Some("free_ivy")).await;
    }
    assert_eq!(
        send(&app, "GET", "/limited", Some("free_ivy"))
            .await
            .status(),
        429
    );
    assert_eq!(
        send(&app, "GET", "/free", Some("free_ivy")).await.status(),
        200
    );
}

async fn send_as(app: &Router, key: &str, ip: &str) -> u16 {
    use axum::extract::ConnectInfo;
    let mut req = Request::get("/api/users")
        .header("x-api-key", key)
        .body(Body::empty())
        .unwrap();
    req.extensions_mut().insert(ConnectInfo(
        format!("{ip}:4000")
            .parse::<std::net::SocketAddr>()
            .unwrap(),
    ));
    app.clone().oneshot(req).await.unwrap().status().as_u16()
}

#[tokio::test]
async fn an_ip_scoped_limit_stops_one_client_cycling_through_many_keys() {
    let p = Policy::builder()
        .tier(
            Tier::new("free")
                .limit(Limit::token_bucket("burst", 5, 0.01))
                .limit(Limit::token_bucket("per_ip", 8, 0.01).with_scope(Scope::Ip)),
        )
        .tier(Tier::new("anonymous").limit(Limit::per_second("burst", 5)))
        .build()
        .unwrap();
    let (app, _) = app_with(p).await;
    let mut ok = 0;
    for i in 0..20 {
        if send_as(&app, &format!("key_{i}"), "198.51.100.7").await == 200 {
            ok += 1;
        }
    }
    assert_eq!(ok, 8, "twenty fresh keys from one IP meet the IP's ceiling");
    assert_eq!(
        send_as(&app, "key_new", "198.51.100.8").await,
        200,
        "another IP is untouched"
    );
}

#[tokio::test]
async fn a_route_scoped_limit_is_one_ceiling_for_every_client() {
    let p = Policy::builder()
        .tier(Tier::new("free").limit(Limit::token_bucket("burst", 100, 1.0)))
        .tier(Tier::new("anonymous").limit(Limit::per_second("burst", 5)))
        .route(
            RouteRule::new("GET", "/api/users")
                .with_limit(Limit::token_bucket("endpoint", 6, 0.01).with_scope(Scope::Route)),
        )
        .build()
        .unwrap();
    let (app, _) = app_with(p).await;
    let statuses: Vec<u16> = get_as_distinct_clients(&app, 10).await;
    assert_eq!(statuses.iter().filter(|s| **s == 200).count(), 6);
    assert_eq!(send(&app, "GET", "/health", None).await.status(), 200);
}

async fn get_as_distinct_clients(app: &Router, n: usize) -> Vec<u16> {
    let mut out = Vec::new();
    for i in 0..n {
        out.push(
            send(app, "GET", "/api/users", Some(&format!("client_{i}")))
                .await
                .status()
                .as_u16(),
        );
    }
    out
}

#[tokio::test]
async fn a_partition_enforces_its_share_of_every_quota() {
    let p = Policy::builder()
        .partition(0.5)
        .tier(Tier::new("free").limit(Limit::token_bucket("burst", 10, 0.01)))
        .tier(Tier::new("anonymous").limit(Limit::per_second("burst", 4)))
        .build()
        .unwrap();
    let (app, _) = app_with(p).await;
    let statuses = (0..8).map(|_| send(&app, "GET", "/api/users", Some("free_region")));
    let mut ok = 0;
    for s in statuses {
        if s.await.status() == 200 {
            ok += 1;
        }
    }
    assert_eq!(ok, 5, "half of a burst of 10");
}

#[tokio::test]
async fn a_custom_tier_resolver_chooses_the_tier() {
    struct ClaimResolver;
    impl ratewatch::TierResolver for ClaimResolver {
        fn resolve(&self, id: &ratewatch::Identity, _: &http::request::Parts) -> Option<String> {
            // Stands in for a JWT claim or a customer lookup.
            id.raw().ends_with(".gold").then(|| "pro".to_owned())
        }
    }
    let limiter = Limiter::builder(policy())
        .with_resolver(Arc::new(ClaimResolver))
        .build()
        .await
        .unwrap();
    let app = server::app(limiter);
    let res = send(&app, "GET", "/api/users", Some("customer.gold")).await;
    assert_eq!(
        header(&res, "x-ratelimit-limit"),
        "100",
        "the resolver's tier"
    );
    let res = send(&app, "GET", "/api/users", Some("customer.plain")).await;
    assert_eq!(
        header(&res, "x-ratelimit-limit"),
        "10",
        "the key-prefix rule otherwise"
    );
}

#[tokio::test(start_paused = true)]
async fn a_shaping_leaky_bucket_delays_instead_of_rejecting() {
    use ratewatch::algorithm::Algorithm;
    let shaper = Limit::new(
        "smooth",
        Algorithm::LeakyBucket {
            rate_per_second: 10.0,
            capacity: 5,
            max_delay_us: 1_000_000,
        },
    );
    let p = Policy::builder()
        .tier(Tier::new("free").limit(shaper))
        .tier(Tier::new("anonymous").limit(Limit::per_second("burst", 4)))
        .build()
        .unwrap();
    let (app, _) = app_with(p).await;
    let started = tokio::time::Instant::now();
    for i in 0..3u64 {
        let before = tokio::time::Instant::now();
        let res = send(&app, "GET", "/api/users", Some("free_shaped")).await;
        assert_eq!(res.status(), 200);
        // The queue ahead drains at 10/s: request i waits i × 100 ms on the
        // limiter's clock, which did not move, so the waits add up.
        assert_eq!(before.elapsed(), std::time::Duration::from_millis(100 * i));
    }
    assert_eq!(started.elapsed(), std::time::Duration::from_millis(300));
}

#[tokio::test]
async fn retry_after_jitter_stays_within_its_bound_and_never_undercuts_t() {
    let mut p = policy();
    p.resilience.retry_after_jitter = std::time::Duration::from_secs(5);
    let (app, _) = app_with(p).await;
    let mut seen = std::collections::BTreeSet::new();
    for i in 0..40 {
        let key = format!("free_jitter_{i}");
        for _ in 0..10 {
            send(&app, "GET", "/api/users", Some(&key)).await;
        }
        let res = send(&app, "GET", "/api/users", Some(&key)).await;
        assert_eq!(res.status(), 429);
        let retry: u64 = header(&res, "retry-after").parse().unwrap();
        let t = sf_list(header(&res, "ratelimit"))[0].1[1].1 as u64;
        assert!(retry >= t && retry <= t + 5, "retry {retry} vs t {t}");
        seen.insert(retry);
    }
    assert!(seen.len() > 1, "jitter spreads the retries: {seen:?}");
}

/// The memory store decides in `call` itself (no future to poll for the
/// decision): a response future dropped unpolled has been charged, and the
/// layer's answer then needs nothing but the inner service.
#[tokio::test]
async fn the_memory_store_decides_in_call_before_the_response_future_is_polled() {
    use ratewatch::identity::{Identity, IdentityKind};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tower::{Layer, Service};

    let policy = Policy::builder()
        .tier(
            Tier::new("free")
                .match_prefix("free_")
                .limit(Limit::token_bucket("burst", 2, 0.001)),
        )
        .tier(Tier::new("anonymous").limit(Limit::per_second("burst", 5)))
        .build()
        .expect("valid policy");
    let limiter = Limiter::new(policy).await.expect("limiter");
    let handled = Arc::new(AtomicUsize::new(0));
    let counter = handled.clone();
    let inner = tower::service_fn(move |_req: Request<Body>| {
        let counter = counter.clone();
        async move {
            counter.fetch_add(1, Ordering::SeqCst);
            Ok::<_, std::convert::Infallible>(Response::new(Body::empty()))
        }
    });
    let mut svc = limiter.layer().layer(inner);
    let req = || {
        Request::get("/")
            .header("x-api-key", "free_unpolled")
            .body(Body::empty())
            .expect("request")
    };
    for _ in 0..2 {
        svc.ready().await.expect("ready");
        drop(svc.call(req()));
    }
    let caller = Identity::new(IdentityKind::ApiKey, "free_unpolled");
    let seen = limiter.peek(&caller, "free", None).await;
    assert!(
        seen.limits[0].remaining.is_some_and(|r| r < 1.0),
        "{seen:?}"
    );
    assert_eq!(handled.load(Ordering::SeqCst), 0, "no handler ran");
    svc.ready().await.expect("ready");
    let res = svc.call(req()).await.expect("response");
    assert_eq!(res.status(), 429);
    assert_eq!(handled.load(Ordering::SeqCst), 0);
}
