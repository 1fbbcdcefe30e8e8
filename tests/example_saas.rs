//! The `saas` example, driven as its users would, and as an attacker would:
//! an app with state whose limiter decides on the claims its auth layer
//! verified, a problem+json refusal, a handler reading the decision, and
//! the status, metrics and dashboard routes mounted in the same stateful
//! router. The example is an outside crate: it sees ratewatch's public API
//! only.

#[path = "../examples/saas.rs"]
#[allow(dead_code)]
mod saas;

use std::net::SocketAddr;
use std::sync::atomic::Ordering;

use axum::body::Body;
use axum::extract::connect_info::MockConnectInfo;
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use tower::ServiceExt;

async fn get(app: &axum::Router, path: &str, token: Option<&str>) -> http::Response<Body> {
    let mut req = Request::get(path);
    if let Some(t) = token {
        req = req.header("authorization", format!("Bearer {t}"));
    }
    app.clone()
        .oneshot(req.body(Body::empty()).unwrap())
        .await
        .unwrap()
}

/// `GET path` with `headers`.
async fn get_with(
    app: &axum::Router,
    path: &str,
    headers: &[(&str, &str)],
) -> http::Response<Body> {
    let mut req = Request::get(path);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    app.clone()
        .oneshot(req.body(Body::empty()).unwrap())
        .await
        .unwrap()
}

async fn json(res: http::Response<Body>) -> serde_json::Value {
    let bytes = res.into_body().collect().await.unwrap().to_bytes();
    serde_json::from_slice(&bytes).unwrap()
}

async fn app() -> (axum::Router, saas::AppState) {
    let limiter = saas::limiter().await;
    let state = saas::demo_state();
    let app = saas::app(&limiter, state.clone())
        .layer(MockConnectInfo(SocketAddr::from(([198, 51, 100, 7], 4000))));
    (app, state)
}

#[tokio::test]
async fn the_plan_from_the_auth_layer_picks_the_tier_and_the_handler_sees_its_quota() {
    let (app, _) = app().await;
    let body = json(get(&app, "/api/orders", Some("tok_alice")).await).await;
    assert_eq!(body["customer"], "alice");
    assert_eq!(body["plan"], "starter");
    assert_eq!(body["remaining"], 2, "3 in the starter burst, 1 spent");
    let body = json(get(&app, "/api/orders", Some("tok_bob")).await).await;
    assert_eq!(body["plan"], "business");
    assert_eq!(body["remaining"], 19);
}

#[tokio::test]
async fn a_block_is_answered_as_problem_json_with_the_rate_limit_headers_and_is_counted() {
    let (app, state) = app().await;
    for _ in 0..3 {
        assert_eq!(
            get(&app, "/api/orders", Some("tok_alice")).await.status(),
            200
        );
    }
    let res = get(&app, "/api/orders", Some("tok_alice")).await;
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        res.headers()["content-type"],
        "application/problem+json",
        "the app's refusal"
    );
    let retry: u64 = res.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(retry >= 1);
    assert!(res.headers().contains_key("ratelimit"));
    assert_eq!(res.headers()["x-ratelimit-remaining"], "0");
    let body = json(res).await;
    assert_eq!(body["status"], 429);
    assert_eq!(body["retry_after"], retry);
    assert!(body["detail"].as_str().unwrap().contains("starter"));
    assert_eq!(state.blocked.load(Ordering::Relaxed), 1, "the hook saw it");
    // Another customer is untouched.
    assert_eq!(
        get(&app, "/api/orders", Some("tok_bob")).await.status(),
        200
    );
}

#[tokio::test]
async fn callers_without_claims_fall_back_to_the_anonymous_tier_by_ip() {
    let (app, _) = app().await;
    // An unknown token carries no claims: the key-prefix rule puts it in
    // the default tier, and an anonymous caller in the anonymous tier.
    let body = json(get(&app, "/api/orders", None).await).await;
    assert_eq!(body["plan"], "anonymous");
    assert_eq!(get(&app, "/api/orders", None).await.status(), 200);
    let res = get(&app, "/api/orders", None).await;
    assert_eq!(res.status(), 429, "2 per minute per IP");
}

#[tokio::test]
async fn status_metrics_and_dashboard_mount_in_the_stateful_router() {
    let (app, _) = app().await;
    let res = get(&app, "/api/quota", Some("tok_bob")).await;
    assert_eq!(res.status(), 200);
    let body = json(res).await;
    assert_eq!(body["tier"], "business", "the status resolves tiers too");
    assert_eq!(body["limits"][0]["remaining"], 20, "looking is free");
    assert_eq!(get(&app, "/metrics", None).await.status(), 200);
    // The dashboard answers loopback callers only: this one is remote.
    assert_eq!(
        get(&app, "/dashboard/api/policy", None).await.status(),
        StatusCode::FORBIDDEN
    );
}

#[tokio::test]
async fn a_valid_token_with_an_invented_api_key_gets_no_fresh_quota() {
    let (app, _) = app().await;
    let mut passed = 0;
    for i in 0..200 {
        let key = format!("rnd_{i}");
        let res = get_with(
            &app,
            "/api/orders",
            &[("authorization", "Bearer tok_alice"), ("x-api-key", &key)],
        )
        .await;
        if res.status() == StatusCode::OK {
            passed += 1;
        } else {
            assert_eq!(res.status(), StatusCode::BAD_REQUEST);
            let body = json(res).await;
            assert!(
                body["detail"]
                    .as_str()
                    .unwrap()
                    .contains("conflicting credentials"),
                "{body}"
            );
        }
    }
    assert_eq!(passed, 0, "two different credentials are refused");
    // Alice's own quota is untouched: her starter burst of 3.
    for _ in 0..3 {
        assert_eq!(
            get(&app, "/api/orders", Some("tok_alice")).await.status(),
            200
        );
    }
    assert_eq!(
        get(&app, "/api/orders", Some("tok_alice")).await.status(),
        429
    );
}

#[tokio::test]
async fn invented_tokens_share_the_anonymous_quota_of_their_address() {
    let (app, _) = app().await;
    let mut passed = 0;
    for i in 0..200 {
        let token = format!("tok_invented_{i}");
        if get(&app, "/api/orders", Some(&token)).await.status() == StatusCode::OK {
            passed += 1;
        }
    }
    assert_eq!(
        passed, 2,
        "200 unverified tokens: the anonymous 2 per minute"
    );
    // The status handler sees the same caller.
    let body = json(get(&app, "/api/quota", Some("tok_invented_x")).await).await;
    assert_eq!(body["tier"], "anonymous");
    assert_eq!(body["limits"][0]["remaining"], 0);
}

#[tokio::test]
async fn two_authorization_headers_or_two_api_keys_that_differ_are_a_400() {
    let (app, _) = app().await;
    for headers in [
        [
            ("authorization", "Bearer tok_alice"),
            ("authorization", "Bearer tok_bob"),
        ],
        [("x-api-key", "a"), ("x-api-key", "b")],
    ] {
        let res = get_with(&app, "/api/orders", &headers).await;
        assert_eq!(res.status(), StatusCode::BAD_REQUEST, "{headers:?}");
        let res = get_with(&app, "/api/quota", &headers).await;
        assert_eq!(res.status(), StatusCode::BAD_REQUEST, "the status agrees");
    }
    // The same token twice is one credential.
    let twice = [
        ("authorization", "Bearer tok_bob"),
        ("authorization", "Bearer tok_bob"),
    ];
    let body = json(get_with(&app, "/api/orders", &twice).await).await;
    assert_eq!(body["customer"], "bob");
}

#[tokio::test]
async fn the_quota_route_reports_what_the_layer_decided() {
    let (app, _) = app().await;
    for _ in 0..2 {
        assert_eq!(
            get(&app, "/api/orders", Some("tok_alice")).await.status(),
            200
        );
    }
    let body = json(get(&app, "/api/quota", Some("tok_alice")).await).await;
    assert_eq!(body["tier"], "starter");
    assert_eq!(
        body["limits"][0]["remaining"], 1,
        "3 less the 2 the layer admitted"
    );
}

#[tokio::test]
async fn a_plan_the_policy_does_not_define_is_refused_and_counted() {
    let limiter = saas::limiter().await;
    let mut state = saas::demo_state();
    let mut tokens = (*state.tokens).clone();
    tokens.insert(
        "tok_carol".into(),
        saas::Claims {
            sub: "carol".into(),
            plan: "platinum".into(),
        },
    );
    state.tokens = std::sync::Arc::new(tokens);
    let app = saas::app(&limiter, state)
        .layer(MockConnectInfo(SocketAddr::from(([198, 51, 100, 7], 4000))));
    let res = get(&app, "/api/orders", Some("tok_carol")).await;
    assert_eq!(
        res.status(),
        StatusCode::FORBIDDEN,
        "never a silent default plan"
    );
    assert_eq!(res.headers()["content-type"], "application/problem+json");
    let scrape = get(&app, "/metrics", None)
        .await
        .into_body()
        .collect()
        .await
        .unwrap()
        .to_bytes();
    let scrape = String::from_utf8_lossy(&scrape);
    let line = scrape
        .lines()
        .find(|l| l.starts_with("ratewatch_unknown_tier_total{source=\"identity\"}"))
        .unwrap_or_else(|| panic!("the metric is exported: {scrape}"));
    let count: f64 = line.rsplit(' ').next().unwrap().parse().unwrap();
    assert!(count >= 1.0, "{line}");
}
