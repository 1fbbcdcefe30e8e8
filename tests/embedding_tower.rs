//! The layer around services that are not axum routers: a tonic gRPC
//! server over a real socket (h2c), a plain `tower::service_fn` answering
//! `http::Response<String>`; peer addresses from a plain `SocketAddr` or
//! the app's own lookup; and decisions that say honestly when the store
//! could not decide.

mod support;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::routing::{get, post};
use axum::{Extension, Router};
use http::{Request, Response, StatusCode};
use ratewatch::policy::{
    BreakerSettings, FailurePolicy, Limit, Policy, ResilienceSettings, RouteRule, StoreKind,
    StoreSettings, Tier,
};
use ratewatch::{Decision, Limiter, Source};
use support::RedisServer;
use tower::{Service, ServiceBuilder, ServiceExt, service_fn};

fn policy(capacity: u64) -> Policy {
    Policy::builder()
        .tier(
            Tier::new("free")
                .match_prefix("free_")
                .limit(Limit::token_bucket("burst", capacity, 0.001)),
        )
        .tier(Tier::new("anonymous").limit(Limit::token_bucket("burst", capacity, 0.001)))
        .build()
        .expect("valid policy")
}

/// The example's hand-written gRPC service (no protoc).
#[path = "../examples/grpc_tonic/greeter.rs"]
mod greeter;

/// Serves `greeter` behind the limiter's layer on a real socket, h2c.
async fn grpc_server(limiter: &Limiter) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let layer = limiter.layer().with_peer_addr(|e: &http::Extensions| {
        e.get::<tonic::transport::server::TcpConnectInfo>()
            .and_then(|c| c.remote_addr())
    });
    let server = tonic::transport::Server::builder()
        .layer(layer)
        .add_service(greeter::GreeterServer);
    let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
    tokio::spawn(server.serve_with_incoming(incoming));
    addr
}

async fn channel(addr: SocketAddr) -> tonic::transport::Channel {
    tonic::transport::Channel::from_shared(format!("http://{addr}"))
        .expect("uri")
        .connect()
        .await
        .expect("connect")
}

#[tokio::test]
async fn a_tonic_service_is_limited_with_resource_exhausted_and_rate_limit_metadata() {
    let limiter = Limiter::new(policy(2)).await.expect("limiter");
    let channel = channel(grpc_server(&limiter).await).await;
    for _ in 0..2 {
        let ok = greeter::say_hello(channel.clone(), Some("free_grpc"))
            .await
            .expect("within the quota");
        assert_eq!(ok.get_ref().message, "hello ratewatch");
        assert!(
            ok.metadata().get("ratelimit").is_some(),
            "an allowed call carries its quota too: {:?}",
            ok.metadata()
        );
    }
    let refused = greeter::say_hello(channel.clone(), Some("free_grpc"))
        .await
        .expect_err("the third call is over the burst");
    assert_eq!(
        refused.code(),
        tonic::Code::ResourceExhausted,
        "{refused:?}"
    );
    assert!(refused.message().contains("\"burst\""), "{refused:?}");
    let md = refused.metadata();
    let text = |k: &str| md.get(k).and_then(|v| v.to_str().ok()).unwrap_or_default();
    assert!(text("ratelimit").starts_with("\"burst\";r=0;t="), "{md:?}");
    assert_eq!(text("ratelimit-policy"), "\"burst\";q=2;w=2000", "{md:?}");
    assert_eq!(text("x-ratelimit-remaining"), "0");
    let retry: u64 = text("retry-after")
        .parse()
        .expect("Retry-After in metadata");
    assert!(retry >= 1);
    // Another caller still gets through: the refusal was for this key.
    greeter::say_hello(channel, Some("free_other"))
        .await
        .expect("another key has its own quota");
}

#[tokio::test]
async fn a_grpc_refusal_is_http_200_with_grpc_status_8_in_the_headers() {
    let limiter = Limiter::new(policy(1)).await.expect("limiter");
    let addr = grpc_server(&limiter).await;
    // A raw h2c request, as any gRPC client sends it: the status must be in
    // the headers of an HTTP 200 ("trailers-only"), never an HTTP 429.
    let mut raw = channel(addr).await;
    let req = || {
        Request::post(format!("http://{addr}{}", greeter::PATH))
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .header("x-api-key", "free_raw")
            .body(tonic::body::Body::empty())
            .expect("request")
    };
    let first = raw
        .ready()
        .await
        .expect("ready")
        .call(req())
        .await
        .expect("first");
    assert_eq!(first.status(), StatusCode::OK);
    let second = raw
        .ready()
        .await
        .expect("ready")
        .call(req())
        .await
        .expect("second");
    assert_eq!(
        second.status(),
        StatusCode::OK,
        "gRPC refusals are HTTP 200"
    );
    assert_eq!(second.headers()["grpc-status"], "8");
    assert_eq!(second.headers()["content-type"], "application/grpc");
    assert!(second.headers().contains_key("grpc-message"));
    assert!(second.headers().contains_key("ratelimit"));
}

#[tokio::test]
async fn an_anonymous_grpc_caller_is_limited_by_the_peer_address_tonic_recorded() {
    let limiter = Limiter::new(policy(1)).await.expect("limiter");
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let layer = limiter
        .layer()
        .with_peer_addr(|e: &http::Extensions| {
            e.get::<tonic::transport::server::TcpConnectInfo>()
                .and_then(|c| c.remote_addr())
        })
        .on_decision(move |_, id| log.lock().unwrap().push(id.ip));
    let server = tonic::transport::Server::builder()
        .layer(layer)
        .add_service(greeter::GreeterServer);
    tokio::spawn(
        server.serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    let channel = channel(addr).await;
    greeter::say_hello(channel.clone(), None)
        .await
        .expect("first anonymous call");
    let refused = greeter::say_hello(channel, None).await.expect_err("over");
    assert_eq!(refused.code(), tonic::Code::ResourceExhausted);
    let ips = seen.lock().unwrap().clone();
    assert_eq!(
        ips,
        vec![Some("127.0.0.1".parse().unwrap()); 2],
        "the peer IP"
    );
}

/// A plain tower service with a `String` body, no axum anywhere.
fn hello_service(
    limiter: &Limiter,
) -> impl tower::Service<
    Request<String>,
    Response = Response<ratewatch::layer::ResponseBody<String>>,
    Error = Infallible,
    Future: Send,
> + Clone {
    ServiceBuilder::new()
        .layer(limiter.layer())
        .service(service_fn(|req: Request<String>| async move {
            let left = req
                .extensions()
                .get::<Decision>()
                .and_then(|d| d.most_constraining())
                .and_then(|l| l.remaining)
                .unwrap_or(-1.0);
            Ok::<_, Infallible>(Response::new(format!("hello; {left} left")))
        }))
}

fn from_peer(peer: &str) -> Request<String> {
    let mut req = Request::new(String::new());
    // What a hyper or tower server that knows the peer leaves behind.
    req.extensions_mut()
        .insert(peer.parse::<SocketAddr>().expect("addr"));
    req
}

#[tokio::test]
async fn a_service_fn_with_string_bodies_is_limited_and_refused_in_its_own_body() {
    let limiter = Limiter::new(policy(2)).await.expect("limiter");
    let svc = hello_service(&limiter);
    let ok = svc
        .clone()
        .oneshot(from_peer("192.0.2.1:1000"))
        .await
        .unwrap();
    assert_eq!(ok.status(), StatusCode::OK);
    assert_eq!(
        ok.body().get_ref(),
        "hello; 1 left",
        "the handler read its decision"
    );
    assert_eq!(ok.headers()["x-ratelimit-remaining"], "1");
    svc.clone()
        .oneshot(from_peer("192.0.2.1:1001"))
        .await
        .unwrap();
    let refused = svc
        .clone()
        .oneshot(from_peer("192.0.2.1:1002"))
        .await
        .unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(refused.headers()["content-type"], "application/json");
    assert!(refused.headers().contains_key("retry-after"));
    let body: serde_json::Value =
        serde_json::from_str(refused.body().get_ref()).expect("JSON body");
    assert_eq!(body["error"], "rate_limited");
    assert_eq!(body["limit"], "burst");
    assert!(
        refused.extensions().get::<Decision>().is_some(),
        "outer layers see the decision"
    );
    // The peer address in the extensions is the anonymous identity: a
    // different peer has its own bucket.
    let other = svc.oneshot(from_peer("192.0.2.2:1000")).await.unwrap();
    assert_eq!(other.status(), StatusCode::OK);
}

#[tokio::test]
async fn an_apps_own_refusal_is_converted_into_a_string_body() {
    use axum::response::IntoResponse;
    let limiter = Limiter::new(policy(1)).await.expect("limiter");
    let svc = ServiceBuilder::new()
        .layer(limiter.layer().with_refusal(|r| {
            (r.status(), [("content-type", "text/plain")], "slow down").into_response()
        }))
        .service(service_fn(|_: Request<String>| async {
            Ok::<_, Infallible>(Response::new(String::from("hi")))
        }));
    svc.clone().oneshot(from_peer("192.0.2.9:1")).await.unwrap();
    let refused = svc.oneshot(from_peer("192.0.2.9:1")).await.unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(refused.body().get_ref(), "slow down");
    assert_eq!(refused.headers()["content-type"], "text/plain");
    assert!(refused.headers().contains_key("ratelimit"));
}

#[tokio::test]
async fn a_peer_lookup_of_the_apps_own_names_the_anonymous_caller() {
    #[derive(Clone)]
    struct Conn(SocketAddr);
    let limiter = Limiter::new(policy(1)).await.expect("limiter");
    let seen = Arc::new(Mutex::new(None));
    let log = seen.clone();
    let svc = ServiceBuilder::new()
        .layer(
            limiter
                .layer()
                .with_peer_addr(|e: &http::Extensions| e.get::<Conn>().map(|c| c.0))
                .on_decision(move |_, id| *log.lock().unwrap() = id.ip),
        )
        .service(service_fn(|_: Request<String>| async {
            Ok::<_, Infallible>(Response::new(String::new()))
        }));
    let mut req = Request::new(String::new());
    req.extensions_mut()
        .insert(Conn("203.0.113.5:999".parse().unwrap()));
    svc.oneshot(req).await.unwrap();
    assert_eq!(*seen.lock().unwrap(), Some("203.0.113.5".parse().unwrap()));
}

#[tokio::test]
async fn the_hook_and_the_decision_name_the_route_rule_and_the_method() {
    let p = Policy::builder()
        .tier(Tier::new("free").limit(Limit::token_bucket("burst", 10, 1.0)))
        .tier(Tier::new("anonymous").limit(Limit::token_bucket("burst", 10, 1.0)))
        .route(RouteRule::new("POST", "/api/export/{id}").with_cost(2))
        .build()
        .expect("policy");
    let limiter = Limiter::new(p).await.expect("limiter");
    let hooked = Arc::new(Mutex::new(Vec::new()));
    let log = hooked.clone();
    let app: Router = Router::new()
        .route(
            "/api/export/{id}",
            post(|Extension(d): Extension<Decision>| async move {
                format!("{:?} {:?}", d.route.as_deref(), d.method)
            }),
        )
        .route("/api/users", get(|| async { "users" }))
        .layer(limiter.layer().on_decision(move |d, _| {
            log.lock()
                .unwrap()
                .push((d.route.clone(), d.method.clone()))
        }))
        .layer(axum::extract::connect_info::MockConnectInfo(
            SocketAddr::from(([198, 51, 100, 1], 1)),
        ));
    let res = app
        .clone()
        .oneshot(Request::post("/api/export/7").body(Body::empty()).unwrap())
        .await
        .unwrap();
    let body = axum::body::to_bytes(res.into_body(), 1024).await.unwrap();
    assert_eq!(&body[..], b"Some(\"/api/export/{id}\") Some(POST)");
    app.oneshot(Request::get("/api/users").body(Body::empty()).unwrap())
        .await
        .unwrap();
    let hooked = hooked.lock().unwrap().clone();
    assert_eq!(
        hooked,
        vec![
            (Some("/api/export/{id}".into()), Some(http::Method::POST)),
            (None, Some(http::Method::GET)),
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fail_open_decision_says_it_is_a_fallback_and_makes_up_no_quota() {
    let mut redis = RedisServer::start();
    let p = Policy::builder()
        .store(StoreSettings {
            kind: StoreKind::Redis,
            url: Some(redis.url()),
            timeout: Duration::from_millis(50),
            ..Default::default()
        })
        .resilience(ResilienceSettings {
            on_store_failure: FailurePolicy::Open,
            breaker: BreakerSettings {
                failures: 3,
                open: Duration::from_millis(500),
                ..Default::default()
            },
            ..Default::default()
        })
        .tier(
            Tier::new("free")
                .match_prefix("free_")
                .limit(Limit::token_bucket("burst", 50, 1.0))
                .limit(Limit::per_minute("minute", 600)),
        )
        .tier(Tier::new("anonymous").limit(Limit::token_bucket("burst", 5, 1.0)))
        .route(RouteRule::new("GET", "/api/quota"))
        .build()
        .expect("policy");
    let limiter = Limiter::new(p).await.expect("limiter starts");
    let hooked = Arc::new(Mutex::new(Vec::<Decision>::new()));
    let log = hooked.clone();
    let app: Router = Router::new()
        .route(
            "/api/quota",
            get(|Extension(d): Extension<Decision>| async move {
                serde_json::json!({
                    "fallback": d.is_fallback(),
                    "remaining": d.limits.iter().map(|l| l.remaining).collect::<Vec<_>>(),
                })
                .to_string()
            }),
        )
        .layer(
            limiter
                .layer()
                .on_decision(move |d, _| log.lock().unwrap().push(d.clone())),
        );
    let send = || async {
        app.clone()
            .oneshot(
                Request::get("/api/quota")
                    .header("x-api-key", "free_honest")
                    .body(Body::empty())
                    .unwrap(),
            )
            .await
            .unwrap()
    };
    // While Redis answers: a counted decision, with its remaining quota.
    let counted = send().await;
    assert_eq!(counted.headers()["x-ratelimit-remaining"], "49");
    redis.kill();

    let res = send().await;
    assert_eq!(res.status(), StatusCode::OK, "fail-open lets it through");
    let h = res.headers().clone();
    assert_eq!(
        h["ratelimit-policy"], "\"burst\";q=50;w=50, \"minute\";q=600;w=60",
        "the policy is still stated"
    );
    for name in [
        "ratelimit",
        "x-ratelimit-limit",
        "x-ratelimit-remaining",
        "x-ratelimit-reset",
    ] {
        assert!(!h.contains_key(name), "{name}: nothing was counted, {h:?}");
    }
    let d = res
        .extensions()
        .get::<Decision>()
        .expect("decision")
        .clone();
    let body = axum::body::to_bytes(res.into_body(), 1024).await.unwrap();
    let seen: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(
        seen,
        serde_json::json!({"fallback": true, "remaining": [null, null]}),
        "the handler's Extension<Decision>"
    );
    assert!(
        matches!(
            d.source,
            Source::Fallback {
                policy: FailurePolicy::Open,
                ..
            }
        ),
        "{:?}",
        d.source
    );
    assert!(d.most_constraining().is_none());
    let last = hooked.lock().unwrap().last().cloned().expect("hooked");
    assert!(last.is_fallback());
    assert!(
        last.limits.iter().all(|l| l.remaining.is_none()),
        "{last:?}"
    );
    assert_eq!(last.route.as_deref(), Some("/api/quota"));
    assert_eq!(last.method, Some(http::Method::GET));
}
