//! The limit follows the caller, not whatever credential a request carries.
//!
//! Each test plays a client that tries to mint quota (an invented key
//! beside a valid one, two different credentials, invented tokens) or an
//! operator who needs to see a misconfiguration (a resolver naming a tier
//! the policy lacks, an auth layer in the wrong place), against the layer,
//! the status handler, the `ratewatch serve` binary and two limiters
//! sharing a real Redis.

mod support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::Request;
use axum::extract::connect_info::MockConnectInfo;
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::get;
use http::StatusCode;
use http::request::Parts;
use http_body_util::BodyExt;
use ratewatch::identity::{Identity, IdentityKind, Principal};
use ratewatch::{Limiter, Policy, TierResolver};
use support::{Ratewatch, RedisServer, policy_file};
use tower::ServiceExt;

/// Free keys with a burst of 3, pro keys with 50, anonymous callers 2 per
/// minute per address.
const POLICY: &str = r#"
[[tiers]]
name = "free"
match_prefix = "free_"
limits = [{ name = "burst", algorithm = "token_bucket", capacity = 3, refill_per_second = 0.01 }]

[[tiers]]
name = "pro"
match_prefix = "pro_"
limits = [{ name = "burst", algorithm = "token_bucket", capacity = 50, refill_per_second = 0.01 }]

[[tiers]]
name = "anonymous"
limits = [{ name = "minute", algorithm = "fixed_window", limit = 2, window = "60s" }]
"#;

fn policy(extra: &str) -> Policy {
    // `[identity]` first: a TOML table after `[[tiers]]` would belong to it.
    Policy::from_toml_str(&format!("{extra}\n{POLICY}"), None).expect("a valid policy")
}

/// `GET /api` behind the limiter, with the quota status beside it, from
/// one client address.
fn app(limiter: &Limiter) -> Router {
    Router::new()
        .route("/api", get(|| async { "ok" }))
        .layer(limiter.layer())
        .route("/status", get(limiter.status_handler()))
        .layer(MockConnectInfo(SocketAddr::from(([198, 51, 100, 7], 4000))))
}

async fn send(
    app: &Router,
    path: &str,
    headers: &[(&str, &str)],
) -> (StatusCode, serde_json::Value) {
    let mut req = http::Request::get(path);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let res = app
        .clone()
        .oneshot(req.body(Body::empty()).unwrap())
        .await
        .unwrap();
    let status = res.status();
    let bytes = res.into_body().collect().await.unwrap().to_bytes();
    (status, serde_json::from_slice(&bytes).unwrap_or_default())
}

/// How many of `n` requests, each with the headers `headers(i)`, passed.
async fn passed(app: &Router, n: usize, headers: impl Fn(usize) -> Vec<(String, String)>) -> usize {
    let mut ok = 0;
    for i in 0..n {
        let h = headers(i);
        let h: Vec<(&str, &str)> = h.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        if send(app, "/api", &h).await.0 == StatusCode::OK {
            ok += 1;
        }
    }
    ok
}

fn pair(k: &str, v: impl Into<String>) -> (String, String) {
    (k.to_owned(), v.into())
}

#[tokio::test]
async fn a_spent_bearer_key_plus_a_fresh_api_key_is_a_400_naming_both_headers() {
    let limiter = Limiter::new(policy("")).await.unwrap();
    let app = app(&limiter);
    assert_eq!(
        passed(&app, 5, |_| vec![pair(
            "authorization",
            "Bearer free_alice"
        )])
        .await,
        3,
        "the burst of 3"
    );
    let fresh = passed(&app, 50, |i| {
        vec![
            pair("authorization", "Bearer free_alice"),
            pair("x-api-key", format!("free_fresh_{i}")),
        ]
    })
    .await;
    assert_eq!(fresh, 0, "an invented key beside a spent one buys nothing");
    let (status, body) = send(
        &app,
        "/api",
        &[
            ("authorization", "Bearer free_alice"),
            ("x-api-key", "free_other"),
        ],
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(body["error"], "conflicting_credentials");
    let message = body["message"].as_str().unwrap();
    assert!(
        message.contains("x-api-key") && message.contains("authorization"),
        "names the conflict: {message}"
    );
    assert!(
        !message.contains("free_"),
        "never echoes a credential: {message}"
    );
}

#[tokio::test]
async fn repeated_credential_headers_that_differ_are_a_400_and_the_same_value_twice_is_one() {
    let limiter = Limiter::new(policy("")).await.unwrap();
    let app = app(&limiter);
    let (status, body) = send(
        &app,
        "/api",
        &[("x-api-key", "free_a"), ("x-api-key", "free_b")],
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("x-api-key is repeated"),
        "{body}"
    );
    let (status, body) = send(
        &app,
        "/api",
        &[
            ("authorization", "Bearer free_a"),
            ("authorization", "Bearer free_b"),
        ],
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("authorization is repeated"),
        "{body}"
    );
    // The same secret twice, or in both headers, is one credential.
    for headers in [
        vec![("x-api-key", "free_a"), ("x-api-key", "free_a")],
        vec![("x-api-key", "free_a"), ("authorization", "Bearer free_a")],
    ] {
        assert_eq!(send(&app, "/api", &headers).await.0, StatusCode::OK);
    }
    assert_eq!(
        send(&app, "/api", &[("x-api-key", "free_a")]).await.0,
        StatusCode::OK
    );
    assert_eq!(
        send(&app, "/api", &[("x-api-key", "free_a")]).await.0,
        StatusCode::TOO_MANY_REQUESTS,
        "all three spent one burst of 3"
    );
}

/// Answers the anonymous tier for every key it does not know, as the
/// README advises for a resolver that checks keys.
struct KnownKeys;

impl TierResolver for KnownKeys {
    fn resolve(&self, identity: &Identity, _: &Parts) -> Option<String> {
        match identity.raw() {
            "pro_real_customer" => Some("pro".into()),
            _ => Some("anonymous".into()),
        }
    }
}

#[tokio::test]
async fn keys_a_resolver_sends_to_the_anonymous_tier_share_the_anonymous_quota_of_their_address() {
    let limiter = Limiter::builder(policy(""))
        .with_resolver(Arc::new(KnownKeys))
        .build()
        .await
        .unwrap();
    let app = app(&limiter);
    let invented = passed(&app, 100, |i| {
        vec![pair("x-api-key", format!("pro_invented_{i}"))]
    })
    .await;
    assert_eq!(
        invented, 2,
        "100 invented keys share 2 per minute of one address"
    );
    assert_eq!(
        passed(&app, 5, |_| vec![pair("x-api-key", "pro_real_customer")]).await,
        5,
        "the real customer keeps its own quota"
    );
}

#[tokio::test]
async fn unmatched_keys_follow_the_policy_anonymous_by_address_or_refused() {
    let limiter = Limiter::new(policy("[identity]\nunmatched_keys = \"anonymous\""))
        .await
        .unwrap();
    let anonymous = app(&limiter);
    let invented = passed(&anonymous, 50, |i| {
        vec![pair("authorization", format!("Bearer tok_{i}"))]
    })
    .await;
    assert_eq!(invented, 2, "invented tokens count as the anonymous caller");
    let (_, status) = send(&anonymous, "/status", &[("x-api-key", "tok_other")]).await;
    assert_eq!(status["tier"], "anonymous", "the status agrees: {status}");

    let limiter = Limiter::new(policy("[identity]\nunmatched_keys = \"reject\""))
        .await
        .unwrap();
    let app = app(&limiter);
    let (status, body) = send(&app, "/api", &[("x-api-key", "tok_1")]).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (StatusCode::UNAUTHORIZED, Some("api_key_required"))
    );
    assert_eq!(
        send(&app, "/api", &[("x-api-key", "free_ok")]).await.0,
        StatusCode::OK
    );
}

/// Names whatever tier the `x-plan` header asks for (an app bug: the plan
/// should come from the verified account).
struct PlanHeader;

impl TierResolver for PlanHeader {
    fn resolve(&self, _: &Identity, request: &Parts) -> Option<String> {
        request
            .headers
            .get("x-plan")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    }
}

fn parts(headers: &[(&str, &str)]) -> Parts {
    let mut req = http::Request::get("/api");
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let mut parts = req.body(()).unwrap().into_parts().0;
    parts
        .extensions
        .insert(MockConnectInfo(SocketAddr::from(([198, 51, 100, 7], 4000))));
    parts
}

#[tokio::test]
async fn a_resolver_naming_an_unknown_tier_is_refused_counted_and_never_silently_the_default() {
    let limiter = Limiter::builder(policy(""))
        .with_resolver(Arc::new(PlanHeader))
        .build()
        .await
        .unwrap();
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    let request = parts(&[("x-api-key", "free_k"), ("x-plan", "platinum")]);
    let err = metrics::with_local_recorder(&recorder, || limiter.caller(&request)).unwrap_err();
    assert_eq!(err.status(), StatusCode::FORBIDDEN);
    let scrape = handle.render();
    assert!(
        scrape.contains("ratewatch_unknown_tier_total{source=\"resolver\"} 1"),
        "{scrape}"
    );
    assert!(!scrape.contains("platinum"), "the name is never a label");

    let app = app(&limiter);
    let (status, body) = send(
        &app,
        "/api",
        &[("x-api-key", "free_k"), ("x-plan", "platinum")],
    )
    .await;
    assert_eq!(
        (status, body["error"].as_str()),
        (StatusCode::FORBIDDEN, Some("unknown_tier"))
    );
    let (status, _) = send(
        &app,
        "/status",
        &[("x-api-key", "free_k"), ("x-plan", "platinum")],
    )
    .await;
    assert_eq!(
        status,
        StatusCode::FORBIDDEN,
        "the status handler refuses alike"
    );
    assert_eq!(
        send(&app, "/api", &[("x-api-key", "free_k"), ("x-plan", "pro")])
            .await
            .0,
        StatusCode::OK
    );

    // A declared default instead of a refusal.
    let limiter = Limiter::builder(policy("[identity]\nunknown_tier = \"anonymous\""))
        .with_resolver(Arc::new(PlanHeader))
        .build()
        .await
        .unwrap();
    let caller = limiter
        .caller(&parts(&[("x-api-key", "pro_k"), ("x-plan", "platinum")]))
        .unwrap();
    assert_eq!(caller.tier, "anonymous");
}

#[tokio::test]
async fn the_status_handler_reports_what_the_layer_decided_for_the_same_caller() {
    let limiter = Limiter::new(policy("")).await.unwrap();
    let app = app(&limiter);
    let key = [("x-api-key", "free_status_agrees")];
    for _ in 0..2 {
        assert_eq!(send(&app, "/api", &key).await.0, StatusCode::OK);
    }
    let (status, body) = send(&app, "/status", &key).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["tier"], "free");
    assert_eq!(
        body["limits"][0]["remaining"], 1,
        "3 less the 2 the layer admitted"
    );
    // A conflict is a 400 on both.
    let conflict = [
        ("x-api-key", "free_status_agrees"),
        ("authorization", "Bearer free_x"),
    ];
    assert_eq!(
        send(&app, "/status", &conflict).await.0,
        StatusCode::BAD_REQUEST
    );
    assert_eq!(
        send(&app, "/api", &conflict).await.0,
        StatusCode::BAD_REQUEST
    );
}

// --- Verified callers: the auth layer's word ---------------------------------

/// An auth layer that knows one token.
async fn auth(mut req: Request, next: Next) -> Response {
    let verified = req
        .headers()
        .get("authorization")
        .is_some_and(|v| v == "Bearer tok_alice");
    if verified {
        req.extensions_mut()
            .insert(Principal::new("alice").with_tier("free"));
    }
    next.run(req).await
}

async fn principal_limiter() -> Limiter {
    Limiter::builder(policy(""))
        .identity_from_extension::<Principal>()
        .build()
        .await
        .unwrap()
}

#[tokio::test]
async fn with_verified_callers_invented_tokens_share_the_anonymous_quota_of_their_address() {
    let limiter = principal_limiter().await;
    // As the README says: the auth layer added after (outside) the limiter.
    let app = app(&limiter).layer(middleware::from_fn(auth));
    let invented = passed(&app, 100, |i| {
        vec![pair("authorization", format!("Bearer free_{i}"))]
    })
    .await;
    assert_eq!(
        invented, 2,
        "100 unverified tokens: the anonymous 2 per minute"
    );
    assert_eq!(
        passed(&app, 5, |_| vec![pair("authorization", "Bearer tok_alice")]).await,
        3,
        "alice has her own free burst"
    );
    let (_, body) = send(&app, "/status", &[("authorization", "Bearer tok_alice")]).await;
    assert_eq!(
        (
            body["tier"].as_str(),
            body["limits"][0]["remaining"].as_u64()
        ),
        (Some("free"), Some(0))
    );
}

#[tokio::test]
async fn an_auth_layer_inside_the_limiter_runs_too_late_and_everyone_is_anonymous() {
    let limiter = principal_limiter().await;
    // The wrong order: the auth layer is added first, so it runs after
    // the limiter has decided.
    let app = Router::new()
        .route("/api", get(|| async { "ok" }))
        .layer(middleware::from_fn(auth))
        .layer(limiter.layer())
        .layer(MockConnectInfo(SocketAddr::from(([198, 51, 100, 7], 4000))));
    assert_eq!(
        passed(&app, 5, |_| vec![pair("authorization", "Bearer tok_alice")]).await,
        2,
        "the verified customer is limited as anonymous: the order matters"
    );
}

// --- Keyed identity hashes ----------------------------------------------------

fn redis_policy(url: &str, secret: Option<&str>) -> Policy {
    let identity = secret.map_or(String::new(), |s| {
        format!("[identity]\nhash_secret = \"{s}\"\n")
    });
    policy(&format!(
        "{identity}[store]\nkind = \"redis\"\nurl = \"{url}\"\ntimeout_ms = 500\n"
    ))
}

fn free_caller(key: &str) -> Identity {
    Identity::new(IdentityKind::ApiKey, key)
}

#[tokio::test]
async fn two_limiters_with_one_secret_share_quota_on_redis_and_another_secret_names_other_keys() {
    let redis = RedisServer::start();
    let secret = "one secret for the whole fleet";
    let a = Limiter::new(redis_policy(&redis.url(), Some(secret)))
        .await
        .unwrap();
    let b = Limiter::new(redis_policy(&redis.url(), Some(secret)))
        .await
        .unwrap();
    let caller = free_caller("free_shared_by_two");
    for limiter in [&a, &b, &a] {
        assert!(limiter.check(&caller, "free", None).await.allowed);
    }
    assert!(
        !b.check(&caller, "free", None).await.allowed,
        "one burst of 3 across both"
    );
    // Key names carry the keyed hash, never the unkeyed one anyone could
    // recompute from a guessed key.
    let keys = redis.cli(&["--scan", "--pattern", "rw:*"]);
    let unkeyed = support::limiter_key(
        "free_shared_by_two",
        "burst",
        &ratewatch::algorithm::Algorithm::TokenBucket {
            capacity: 3,
            refill_per_second: 0.01,
        },
    );
    assert!(!keys.is_empty() && !keys.contains(&unkeyed), "{keys}");
    // Another secret: other names for the same caller.
    let other = Limiter::new(redis_policy(&redis.url(), Some("another fleet's secret")))
        .await
        .unwrap();
    assert!(other.check(&caller, "free", None).await.allowed);
    let masked = |l: &Limiter| {
        let request = parts(&[("x-api-key", "free_shared_by_two")]);
        l.caller(&request).unwrap().identity.masked()
    };
    assert_eq!(masked(&a), masked(&b));
    assert_ne!(
        masked(&a),
        masked(&other),
        "the dashboard's form follows the secret"
    );
    assert_ne!(
        masked(&a),
        caller.masked(),
        "and differs from the unkeyed form"
    );
}

#[tokio::test]
async fn without_a_secret_redis_keeps_the_unkeyed_names_so_upgraded_replicas_still_agree() {
    let redis = RedisServer::start();
    let limiter = Limiter::new(redis_policy(&redis.url(), None))
        .await
        .unwrap();
    assert!(
        limiter
            .check(&free_caller("free_legacy"), "free", None)
            .await
            .allowed
    );
    let key = support::limiter_key(
        "free_legacy",
        "burst",
        &ratewatch::algorithm::Algorithm::TokenBucket {
            capacity: 3,
            refill_per_second: 0.01,
        },
    );
    assert_eq!(redis.cli(&["exists", &key]).trim(), "1");
}

#[tokio::test]
async fn the_secret_comes_from_the_environment_or_a_file_and_a_weak_one_is_refused() {
    let from_env = policy("")
        .with_env_from(|name| {
            (name == "RATEWATCH_HASH_SECRET").then(|| "from the environment!".into())
        })
        .unwrap();
    assert!(from_env.identity.hash_secret.is_some());
    let err = policy("")
        .with_env_from(|name| (name == "RATEWATCH_HASH_SECRET").then(|| "short".into()))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("RATEWATCH_HASH_SECRET") && err.contains("16 bytes"),
        "{err}"
    );
    let err = Policy::from_toml_str("[identity]\nhash_secret = \"short\"\n", Some("p.toml"))
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("p.toml:2:") && err.contains("hash_secret"),
        "{err}"
    );

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("hash_secret");
    std::fs::write(&file, "one secret for the whole fleet\n").unwrap();
    let text = format!("[identity]\nhash_secret_file = \"{}\"\n", file.display());
    let by_file = Limiter::new(policy(&text)).await.unwrap();
    let inline = Limiter::new(policy(
        "[identity]\nhash_secret = \"one secret for the whole fleet\"",
    ))
    .await
    .unwrap();
    let request = parts(&[("x-api-key", "free_k")]);
    assert_eq!(
        by_file.caller(&request).unwrap().identity.hash(),
        inline.caller(&request).unwrap().identity.hash()
    );
    std::fs::remove_file(&file).unwrap();
    let err = Limiter::new(policy(&text)).await.unwrap_err().to_string();
    assert!(err.contains("identity.hash_secret_file"), "{err}");
}

// --- The `ratewatch serve` binary ----------------------------------------------

async fn serve_status(
    client: &reqwest::Client,
    server: &Ratewatch,
    headers: &[(&str, &str)],
) -> u16 {
    let mut req = client.get(format!("{}/api/users", server.url()));
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    req.send()
        .await
        .expect("the server answers")
        .status()
        .as_u16()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_serve_two_servers_with_one_secret_share_quota_and_conflicts_are_400() {
    let redis = RedisServer::start();
    let file = policy_file(&format!(
        "[store]\nkind = \"redis\"\nurl = \"{}\"\ntimeout_ms = 500\n{POLICY}",
        redis.url()
    ));
    let env = [("RATEWATCH_HASH_SECRET", "one secret for the whole fleet")];
    let one = Ratewatch::start("serve", Some(file.path()), &env);
    let two = Ratewatch::start("serve", Some(file.path()), &env);
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let key = [("authorization", "Bearer free_spent_on_two_servers")];
    let mut statuses = Vec::new();
    for server in [&one, &two, &one, &two] {
        statuses.push(serve_status(&client, server, &key).await);
    }
    assert_eq!(statuses, [200, 200, 200, 429], "one burst of 3 across both");
    // The spent key plus a fresh x-api-key: a 400 every time.
    for i in 0..10 {
        let fresh = format!("free_fresh_{i}");
        let headers = [key[0], ("x-api-key", fresh.as_str())];
        assert_eq!(serve_status(&client, &one, &headers).await, 400);
    }
    let twice = [("x-api-key", "free_a"), ("x-api-key", "free_b")];
    assert_eq!(serve_status(&client, &two, &twice).await, 400);
}
