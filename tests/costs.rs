//! Costs per request and settling after the response, on the memory
//! store: `Limiter::check_cost`, `Limiter::reserve` + `Reservation::settle`,
//! and the layer's cost function with `Meter` and `Usage`.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::routing::{get, post};
use http::{Request, StatusCode};
use ratewatch::clock::ManualClock;
use ratewatch::identity::{Identity, IdentityKind};
use ratewatch::{Limit, Limiter, Meter, Policy, RouteRule, Settled, Tier, Usage};
use tower::ServiceExt;

const MINUTE: Duration = Duration::from_secs(60);

fn policy() -> Policy {
    Policy::builder()
        .tier(Tier::new("free").limit(Limit::fixed_window("tokens", 1000, MINUTE)))
        .tier(Tier::new("anonymous").limit(Limit::fixed_window("tokens", 100, MINUTE)))
        .route(RouteRule::new("POST", "/upload").with_cost(10))
        .build()
        .unwrap()
}

async fn limiter_at(clock: &Arc<ManualClock>) -> Limiter {
    Limiter::builder(policy())
        .with_clock(clock.clone())
        .build()
        .await
        .unwrap()
}

fn caller() -> Identity {
    Identity::new(IdentityKind::ApiKey, "free_k")
}

async fn left(limiter: &Limiter) -> f64 {
    limiter.peek(&caller(), "free", None).await.limits[0]
        .remaining
        .unwrap()
}

/// A clock at the start of a minute, so windows roll where a test says.
fn clock() -> Arc<ManualClock> {
    // A whole number of minutes since the epoch.
    Arc::new(ManualClock::new(1_800_000_000_000_000))
}

#[tokio::test]
async fn a_cost_above_every_quota_is_a_refusal_that_names_the_limit_and_charges_nothing() {
    let limiter = limiter_at(&clock()).await;
    let d = limiter.check_cost(&caller(), "free", None, 1001).await;
    assert!(!d.allowed);
    assert_eq!(d.retry_after, None, "waiting never lets it pass");
    let l = d.exceeded_quota().expect("the limit says why");
    assert_eq!((&*l.name, l.quota, l.exceeds_quota), ("tokens", 1000, true));
    assert_eq!(left(&limiter).await, 1000.0);
    // u64::MAX neither wraps nor panics.
    assert!(
        !limiter
            .check_cost(&caller(), "free", None, u64::MAX)
            .await
            .allowed
    );
    // Exactly the quota passes.
    assert!(
        limiter
            .check_cost(&caller(), "free", None, 1000)
            .await
            .allowed
    );
}

#[tokio::test]
async fn a_zero_cost_peeks() {
    let limiter = limiter_at(&clock()).await;
    for _ in 0..5 {
        assert!(limiter.check_cost(&caller(), "free", None, 0).await.allowed);
    }
    assert_eq!(left(&limiter).await, 1000.0);
}

#[tokio::test]
async fn a_settle_refunds_what_was_not_used_and_charges_what_was_used_beyond() {
    let limiter = limiter_at(&clock()).await;
    let (_, r) = limiter.reserve(&caller(), "free", None, 0).await;
    assert_eq!(r.unwrap().settle(0).await, Settled::Exact);
    let (d, r) = limiter.reserve(&caller(), "free", None, 300).await;
    assert!(d.allowed);
    assert_eq!(r.unwrap().settle(120).await, Settled::Refunded(180));
    assert_eq!(left(&limiter).await, 880.0);
    let (_, r) = limiter.reserve(&caller(), "free", None, 100).await;
    assert_eq!(r.unwrap().settle(900).await, Settled::Charged(800));
    // Past the quota: debt, so even one unit is refused now.
    assert!(!limiter.check_cost(&caller(), "free", None, 1).await.allowed);
    let (d, r) = limiter.reserve(&caller(), "free", None, 1).await;
    assert!(!d.allowed && r.is_none(), "a refusal reserves nothing");
}

#[tokio::test]
async fn a_refund_after_the_window_rolled_gives_nothing_back() {
    let clock = clock();
    let limiter = limiter_at(&clock).await;
    let (_, r) = limiter.reserve(&caller(), "free", None, 500).await;
    clock.advance(MINUTE);
    assert!(
        limiter
            .check_cost(&caller(), "free", None, 10)
            .await
            .allowed
    );
    // The old window's units cannot be taken from the new window's count.
    let _ = r.unwrap().settle(0).await;
    assert_eq!(left(&limiter).await, 990.0);
}

#[tokio::test]
async fn a_refund_never_gives_back_more_than_was_charged() {
    let limiter = limiter_at(&clock()).await;
    assert!(
        limiter
            .check_cost(&caller(), "free", None, 200)
            .await
            .allowed
    );
    let (_, r) = limiter.reserve(&caller(), "free", None, 50).await;
    // Reserved 50, used 0: 50 back, not the other request's 200.
    assert_eq!(r.unwrap().settle(0).await, Settled::Refunded(50));
    assert_eq!(left(&limiter).await, 800.0);
}

fn app(limiter: &Limiter) -> Router {
    Router::new()
        .route(
            "/llm",
            post(
                |axum::Extension(meter): axum::Extension<Meter>| async move {
                    meter.add(30);
                    meter.add(12);
                    "answer"
                },
            ),
        )
        .route(
            "/usage",
            post(|| async {
                let mut res = axum::response::Response::new(Body::from("ok"));
                res.extensions_mut().insert(Usage(7));
                res
            }),
        )
        .route(
            "/huge",
            post(
                |axum::Extension(meter): axum::Extension<Meter>| async move {
                    meter.record(u64::MAX);
                    meter.add(u64::MAX);
                    "huge"
                },
            ),
        )
        .route("/upload", post(|| async { "stored" }))
        .route("/none", get(|| async { "nothing recorded" }))
        .layer(limiter.layer().with_cost(|parts: &http::request::Parts| {
            parts.headers.get("x-tokens")?.to_str().ok()?.parse().ok()
        }))
}

fn req(method: &str, path: &str, tokens: Option<&str>) -> Request<Body> {
    let mut b = Request::builder()
        .method(method)
        .uri(path)
        .header("x-api-key", "free_k");
    if let Some(t) = tokens {
        b = b.header("x-tokens", t);
    }
    b.body(Body::empty()).unwrap()
}

/// Waits for the background settle to show in the remaining quota.
async fn settles_to(limiter: &Limiter, want: f64) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let now = left(limiter).await;
        if now == want {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "remaining {now}, want {want}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test]
async fn the_layer_reserves_the_cost_function_s_estimate_and_settles_what_the_meter_counted() {
    let limiter = limiter_at(&clock()).await;
    let res = app(&limiter)
        .oneshot(req("POST", "/llm", Some("100")))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    // Reserved 100, used 42.
    settles_to(&limiter, 958.0).await;
    // A Usage in the response's extensions: reserved 50, used 7.
    let res = app(&limiter)
        .oneshot(req("POST", "/usage", Some("50")))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    settles_to(&limiter, 951.0).await;
    // Nothing recorded: the reservation stands.
    let res = app(&limiter)
        .oneshot(req("GET", "/none", Some("20")))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    settles_to(&limiter, 931.0).await;
}

#[tokio::test]
async fn a_header_that_does_not_parse_is_charged_the_route_cost() {
    let limiter = limiter_at(&clock()).await;
    for bad in ["abc", "-5", "1e3", "99999999999999999999999"] {
        let res = app(&limiter)
            .oneshot(req("POST", "/upload", Some(bad)))
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::OK, "{bad}");
    }
    // Four requests at the upload rule's cost of 10.
    assert_eq!(left(&limiter).await, 960.0);
}

#[tokio::test]
async fn a_cost_no_limit_can_admit_gets_a_429_without_retry_after() {
    let limiter = limiter_at(&clock()).await;
    let huge = u64::MAX.to_string();
    let res = app(&limiter)
        .oneshot(req("POST", "/llm", Some(&huge)))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(res.headers().get("retry-after").is_none());
    let body = axum::body::to_bytes(res.into_body(), 4096).await.unwrap();
    let body = String::from_utf8_lossy(&body);
    assert!(
        body.contains("cost_exceeds_quota") && body.contains("tokens"),
        "{body}"
    );
    assert_eq!(left(&limiter).await, 1000.0);
}

#[tokio::test]
async fn hostile_usage_near_u64_max_is_bounded_debt_never_a_panic() {
    let clock = clock();
    let limiter = limiter_at(&clock).await;
    let res = app(&limiter)
        .oneshot(req("POST", "/huge", Some("10")))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    // The debt is capped at one more quota: -1000 left at most.
    settles_to(&limiter, 0.0).await;
    assert!(!limiter.check_cost(&caller(), "free", None, 1).await.allowed);
    // And it ends with the window.
    clock.advance(MINUTE);
    assert!(limiter.check_cost(&caller(), "free", None, 1).await.allowed);
}

#[tokio::test]
async fn a_client_that_disconnects_mid_handler_is_settled_anyway() {
    let limiter = limiter_at(&clock()).await;
    let (recorded_tx, recorded_rx) = tokio::sync::oneshot::channel::<()>();
    let recorded_tx = Arc::new(parking_lot::Mutex::new(Some(recorded_tx)));
    let app = Router::new()
        .route(
            "/stream",
            post(move |axum::Extension(meter): axum::Extension<Meter>| {
                let tx = recorded_tx.clone();
                async move {
                    meter.add(5);
                    if let Some(tx) = tx.lock().take() {
                        let _ = tx.send(());
                    }
                    // The model is still answering when the client leaves.
                    std::future::pending::<()>().await;
                    "never"
                }
            }),
        )
        .layer(limiter.layer().with_cost(|_| Some(200)));
    let call = tokio::spawn(app.oneshot(req("POST", "/stream", None)));
    recorded_rx.await.unwrap();
    assert_eq!(left(&limiter).await, 800.0);
    // The connection drops: the request's future (and its meter) with it.
    call.abort();
    settles_to(&limiter, 995.0).await;
}

#[tokio::test]
async fn a_meter_is_only_given_to_requests_that_were_admitted_and_counted() {
    let limiter = limiter_at(&clock()).await;
    let app = Router::new()
        .route(
            "/",
            get(|meter: Option<axum::Extension<Meter>>| async move {
                meter.map_or(0, |m| m.reserved()).to_string()
            }),
        )
        .layer(limiter.layer().with_cost(|_| None));
    let res = app.oneshot(req("GET", "/", None)).await.unwrap();
    let body = axum::body::to_bytes(res.into_body(), 64).await.unwrap();
    assert_eq!(&body[..], b"1", "no rule: a cost of 1 reserved");
}

#[tokio::test]
async fn a_content_length_that_lies_is_only_the_reservation() {
    let limiter = limiter_at(&clock()).await;
    let app = Router::new()
        .route(
            "/bytes",
            post(
                |axum::Extension(meter): axum::Extension<Meter>, body: axum::body::Bytes| async move {
                    meter.record(body.len() as u64);
                    "stored"
                },
            ),
        )
        .layer(limiter.layer().with_cost(|parts: &http::request::Parts| {
            parts
                .headers
                .get(http::header::CONTENT_LENGTH)?
                .to_str()
                .ok()?
                .parse()
                .ok()
        }));
    let upload = |declared: &str, body: Vec<u8>| {
        Request::post("/bytes")
            .header("x-api-key", "free_k")
            .header("content-length", declared)
            .body(Body::from(body))
            .unwrap()
    };
    // Declares 10 bytes, sends 300: the 290 beyond are charged.
    let res = app
        .clone()
        .oneshot(upload("10", vec![b'x'; 300]))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    settles_to(&limiter, 700.0).await;
    // Declares more than any quota: refused, nothing read, nothing charged.
    let res = app
        .oneshot(upload("18446744073709551615", vec![b'x'; 5]))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(res.headers().get("retry-after").is_none());
    assert_eq!(left(&limiter).await, 700.0);
}

#[tokio::test]
async fn a_streamed_body_settles_when_the_stream_ends() {
    let limiter = limiter_at(&clock()).await;
    let app = Router::new()
        .route(
            "/stream",
            post(
                |axum::Extension(meter): axum::Extension<Meter>| async move {
                    // The stream owns the meter: it counts as it is read, and
                    // the settle waits for its end.
                    let chunks =
                        futures_util::stream::unfold((meter, 0), |(meter, i)| async move {
                            if i == 4 {
                                return None;
                            }
                            meter.add(25);
                            let chunk = axum::body::Bytes::from_static(b"tok ");
                            Some((Ok::<_, std::convert::Infallible>(chunk), (meter, i + 1)))
                        });
                    Body::from_stream(chunks)
                },
            ),
        )
        .layer(limiter.layer().with_cost(|_| Some(300)));
    let res = app.oneshot(req("POST", "/stream", None)).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    // The head is back, the body not read: only the reservation counts.
    assert_eq!(left(&limiter).await, 700.0);
    let body = axum::body::to_bytes(res.into_body(), 1024).await.unwrap();
    assert_eq!(&body[..], b"tok tok tok tok ");
    // Reserved 300, the stream counted 100.
    settles_to(&limiter, 900.0).await;
}

/// A settle after a reload that changed the limit: the reservation's
/// numbers are not the limit's any more, and settling with them would
/// rescale the state twice (a bucket of 100 raised to 1000 refunded 100
/// with the old capacity came back full: 1000 tokens).
#[tokio::test]
async fn a_settle_after_a_reload_that_changed_the_limit_gives_nothing_extra() {
    let bucket = |capacity| {
        Policy::builder()
            .tier(Tier::new("free").limit(Limit::token_bucket("tokens", capacity, 0.001)))
            .tier(Tier::new("anonymous").limit(Limit::token_bucket("tokens", 10, 0.001)))
            .build()
            .unwrap()
    };
    let clock = clock();
    let limiter = Limiter::builder(bucket(100))
        .with_clock(clock.clone())
        .build()
        .await
        .unwrap();
    let (d, r) = limiter.reserve(&caller(), "free", None, 100).await;
    assert!(d.allowed);
    limiter.replace_policy(bucket(1000)).unwrap();
    // 900 more under the raised capacity: the bucket is empty.
    assert!(
        limiter
            .check_cost(&caller(), "free", None, 900)
            .await
            .allowed
    );
    assert_eq!(left(&limiter).await, 0.0);
    // The request used nothing of its 100: at most those 100 come back.
    assert_eq!(r.unwrap().settle(0).await, Settled::Stale);
    let after = left(&limiter).await;
    assert!(after <= 100.0, "a refund of 100 gave back {after} tokens");
}
