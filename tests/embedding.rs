//! The layer's options as an embedding app uses them: custom refusals for
//! every status, header families switched off, the decision for outer
//! layers, the decision hook, and a custom extractor that cannot drop IP
//! scope by accident.

mod support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::connect_info::MockConnectInfo;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use http::request::Parts;
use http::{Request, StatusCode};
use ratewatch::identity::{Identity, IdentityError, IdentityKind, KeyExtractor};
use ratewatch::layer::{HeaderFamilies, Refusal};
use ratewatch::policy::{
    AnonymousMode, FailurePolicy, IdentitySettings, Limit, Policy, RouteRule, Scope, StoreKind,
    StoreSettings, Tier,
};
use ratewatch::{Decision, Limiter};
use tower::ServiceExt;

fn tiers() -> ratewatch::policy::PolicyBuilder {
    Policy::builder()
        .tier(Tier::new("free").limit(Limit::token_bucket("burst", 2, 0.01)))
        .tier(Tier::new("anonymous").limit(Limit::token_bucket("burst", 2, 0.01)))
}

async fn send(app: &Router, key: Option<&str>, peer: [u8; 4]) -> Response {
    let mut req = Request::get("/x");
    if let Some(k) = key {
        req = req.header("x-api-key", k);
    }
    app.clone()
        .layer(MockConnectInfo(SocketAddr::from((peer, 1234))))
        .oneshot(req.body(Body::empty()).unwrap())
        .await
        .unwrap()
}

const PEER: [u8; 4] = [198, 51, 100, 7];

/// A refusal that names its kind in a header, so each status is seen to
/// come from the app.
fn tagged(r: &Refusal<'_>) -> Response {
    let kind = match r {
        Refusal::RateLimited { .. } => "rate-limited",
        Refusal::Unavailable { .. } => "unavailable",
        Refusal::BadIdentity(_) => "bad-identity",
        Refusal::Unauthorized(_) => "unauthorized",
        _ => "other",
    };
    (r.status(), [("x-refusal", kind)], "custom").into_response()
}

fn app(layer: ratewatch::RateLimitLayer) -> Router {
    Router::new()
        .route("/x", get(|| async { "ok" }))
        .layer(layer)
}

#[tokio::test]
async fn a_custom_refusal_answers_429_400_and_401_and_keeps_the_protocol_headers() {
    let limiter = Limiter::new(tiers().build().unwrap()).await.unwrap();
    let limited = app(limiter.layer().with_refusal(tagged));
    for _ in 0..2 {
        assert_eq!(send(&limited, Some("k"), PEER).await.status(), 200);
    }
    let res = send(&limited, Some("k"), PEER).await;
    assert_eq!(res.status(), 429);
    assert_eq!(res.headers()["x-refusal"], "rate-limited");
    assert!(res.headers().contains_key("retry-after"));
    assert!(res.headers().contains_key("ratelimit-policy"));
    assert_eq!(res.headers()["x-ratelimit-remaining"], "0");

    let res = send(&limited, Some("has space"), PEER).await;
    assert_eq!(res.status(), 400);
    assert_eq!(res.headers()["x-refusal"], "bad-identity");

    let rejecting = tiers()
        .identity(IdentitySettings {
            anonymous: AnonymousMode::Reject,
            ..IdentitySettings::default()
        })
        .build()
        .unwrap();
    let limiter = Limiter::new(rejecting).await.unwrap();
    let rejecting_app = app(limiter.layer().with_refusal(tagged));
    let res = send(&rejecting_app, None, PEER).await;
    assert_eq!(res.status(), 401);
    assert_eq!(res.headers()["x-refusal"], "unauthorized");
    assert_eq!(res.headers()["www-authenticate"], "Bearer");
}

#[tokio::test]
async fn a_custom_refusal_answers_503_when_a_dead_redis_makes_a_route_fail_closed() {
    // Nothing listens on this port: every decision fails, and the route
    // fails closed.
    let store = StoreSettings {
        kind: StoreKind::Redis,
        url: Some(format!("redis://127.0.0.1:{}", support::free_port())),
        timeout: Duration::from_millis(200),
        ..StoreSettings::default()
    };
    let policy = tiers()
        .store(store)
        .route(RouteRule::new("GET", "/x").on_store_failure(FailurePolicy::Closed))
        .build()
        .unwrap();
    let limiter = Limiter::new(policy).await.unwrap();
    let closed = app(limiter.layer().with_refusal(tagged));
    let res = send(&closed, Some("k"), PEER).await;
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(res.headers()["x-refusal"], "unavailable");
    assert!(res.headers().contains_key("retry-after"));
}

#[tokio::test]
async fn header_families_can_be_switched_off_one_by_one() {
    let limiter = Limiter::new(tiers().build().unwrap()).await.unwrap();
    let only_ietf = limiter.layer().with_headers(HeaderFamilies {
        x_ratelimit: false,
        ..HeaderFamilies::ALL
    });
    let res = send(&app(only_ietf), Some("a"), PEER).await;
    assert!(res.headers().contains_key("ratelimit"));
    assert!(res.headers().contains_key("ratelimit-policy"));
    assert!(!res.headers().contains_key("x-ratelimit-limit"));

    let silent = app(limiter.layer().with_headers(HeaderFamilies::NONE));
    for _ in 0..2 {
        let res = send(&silent, Some("b"), PEER).await;
        assert_eq!(res.status(), 200);
        assert!(
            res.headers()
                .keys()
                .all(|h| !h.as_str().contains("ratelimit")),
            "{:?}",
            res.headers()
        );
    }
    let res = send(&silent, Some("b"), PEER).await;
    assert_eq!(
        res.status(),
        429,
        "switching headers off enforces all the same"
    );
    assert!(!res.headers().contains_key("retry-after"));
}

#[tokio::test]
async fn handlers_and_outer_layers_see_the_decision_and_the_hook_sees_every_one() {
    let limiter = Limiter::new(tiers().build().unwrap()).await.unwrap();
    let seen = Arc::new(AtomicU64::new(0));
    let blocked = Arc::new(AtomicU64::new(0));
    let (s, b) = (seen.clone(), blocked.clone());
    let layer = limiter
        .layer()
        .on_decision(move |d: &Decision, who: &Identity| {
            assert_eq!(who.raw(), "billing-key", "the hook can bill the caller");
            s.fetch_add(1, Ordering::Relaxed);
            if !d.allowed {
                b.fetch_add(1, Ordering::Relaxed);
            }
        });
    let app = Router::new()
        .route(
            "/x",
            get(|axum::Extension(d): axum::Extension<Decision>| async move {
                format!("{} left", d.most_constraining().unwrap().remaining.unwrap())
            }),
        )
        .layer(layer)
        .layer(axum::middleware::map_response(|res: Response| async move {
            // An outer layer reads the decision from the response.
            let tier = res
                .extensions()
                .get::<Decision>()
                .map(|d| d.tier.to_string());
            let mut res = res;
            res.headers_mut().insert(
                "x-outer-saw-tier",
                tier.unwrap_or_default().parse().unwrap(),
            );
            res
        }));
    let res = send(&app, Some("billing-key"), PEER).await;
    assert_eq!(res.headers()["x-outer-saw-tier"], "free");
    let body = axum::body::to_bytes(res.into_body(), 1024).await.unwrap();
    assert_eq!(&body[..], b"1 left");
    send(&app, Some("billing-key"), PEER).await;
    let res = send(&app, Some("billing-key"), PEER).await;
    assert_eq!(res.status(), 429);
    assert_eq!(res.headers()["x-outer-saw-tier"], "free", "refusals too");
    assert_eq!(seen.load(Ordering::Relaxed), 3);
    assert_eq!(blocked.load(Ordering::Relaxed), 1);
}

/// Identifies callers by a header of its own and forgets the client IP.
struct TenantHeader;

impl KeyExtractor for TenantHeader {
    fn extract(&self, request: &Parts) -> Result<Identity, IdentityError> {
        let tenant = request
            .headers
            .get("x-api-key")
            .and_then(|v| v.to_str().ok())
            .ok_or(IdentityError::Missing)?;
        Ok(Identity::new(IdentityKind::Custom, tenant))
    }
}

#[tokio::test]
async fn a_custom_extractor_that_forgets_the_ip_keeps_ip_scoped_limits() {
    let policy = Policy::builder()
        .tier(
            Tier::new("free")
                .limit(Limit::token_bucket("burst", 100, 0.01))
                .limit(Limit::token_bucket("per_ip", 3, 0.01).with_scope(Scope::Ip)),
        )
        .tier(Tier::new("anonymous").limit(Limit::token_bucket("burst", 2, 0.01)))
        .build()
        .unwrap();
    let limiter = Limiter::builder(policy)
        .with_extractor(Arc::new(TenantHeader))
        .build()
        .await
        .unwrap();
    let app = app(limiter.layer());
    // One address inventing a key per request meets one IP ceiling.
    let mut ok = 0;
    for i in 0..10 {
        if send(&app, Some(&format!("t{i}")), PEER).await.status() == 200 {
            ok += 1;
        }
    }
    assert_eq!(ok, 3);
    // Another address has its own.
    assert_eq!(
        send(&app, Some("t-other"), [203, 0, 113, 1]).await.status(),
        200
    );
}
