//! The decision service over HTTP on the `--listen` port: `POST /json`
//! (envoyproxy/ratelimit's proto3 JSON) and `POST /v1/decide` (native),
//! loopback-only unless `[rls] token` is set; and its metrics.

mod support;

use std::net::SocketAddr;

use axum::body::Body;
use axum::extract::connect_info::MockConnectInfo;
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use ratewatch::{Limiter, server};
use serde_json::{Value, json};
use tower::ServiceExt;

const EDGE_YAML: &str = r#"
domain: edge
descriptors:
  - key: remote_address
    rate_limit:
      unit: minute
      requests_per_unit: 2
  - key: tight
    rate_limit:
      unit: hour
      requests_per_unit: 1
  - key: free
    rate_limit:
      unlimited: true
"#;

fn policy(extra: &str) -> (tempfile::TempDir, std::path::PathBuf) {
    policy_on("", extra)
}

/// [`policy`] on the store `store` (a `[store]` section, or "" for memory).
fn policy_on(store: &str, extra: &str) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(dir.path().join("edge.yaml"), EDGE_YAML).expect("yaml");
    let toml = format!(
        r#"
{store}

[identity]
default_tier = "free"
anonymous_tier = "free"

[[tiers]]
name = "free"
match_prefix = "free_"
limits = [{{ name = "burst", algorithm = "fixed_window", limit = 2, window = "1h" }}]

[[routes]]
method = "POST"
path = "/api/export"
cost = 2

[rls]
envoy_configs = ["edge.yaml"]
{extra}
"#
    );
    let file = dir.path().join("ratewatch.toml");
    std::fs::write(&file, toml).expect("toml");
    (dir, file)
}

async fn app(extra: &str) -> (tempfile::TempDir, Limiter) {
    app_on("", extra).await
}

async fn app_on(store: &str, extra: &str) -> (tempfile::TempDir, Limiter) {
    // The rules count in minute windows aligned to the epoch: keep a test
    // clear of a window's end, where its counts would reset.
    let into = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis()
        % 60_000;
    if into > 57_000 {
        tokio::time::sleep(std::time::Duration::from_millis(
            (60_000 - into) as u64 + 50,
        ))
        .await;
    }
    let (dir, file) = policy_on(store, extra);
    let limiter = Limiter::from_config_file(&file).await.expect("limiter");
    (dir, limiter)
}

async fn post(
    limiter: &Limiter,
    peer: &str,
    path: &str,
    body: &str,
    token: Option<&str>,
) -> (StatusCode, http::HeaderMap, Value) {
    let peer: SocketAddr = peer.parse().unwrap();
    let app = server::app(limiter.clone()).layer(MockConnectInfo(peer));
    let mut req = Request::post(path).header("content-type", "application/json");
    if let Some(t) = token {
        req = req.header("authorization", format!("Bearer {t}"));
    }
    let res = app
        .oneshot(req.body(Body::from(body.to_owned())).unwrap())
        .await
        .unwrap();
    let status = res.status();
    let headers = res.headers().clone();
    let bytes = res.into_body().collect().await.unwrap().to_bytes();
    let value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    (status, headers, value)
}

/// A request of one descriptor no rule matches, in `path`'s form.
fn unmatched(path: &str) -> &'static str {
    if path == "/json" {
        r#"{"domain":"edge","descriptors":[{"entries":[{"key":"nobody","value":"x"}]}]}"#
    } else {
        r#"{"domain":"edge","descriptors":[{"nobody":"x"}]}"#
    }
}

const LOCAL: &str = "127.0.0.1:5000";
const REMOTE: &str = "203.0.113.7:5000";

#[tokio::test]
async fn json_answers_200_then_429_in_proto3_json() {
    let (_dir, limiter) = app("").await;
    let body = r#"{"domain":"edge","descriptors":[{"entries":[{"key":"remote_address","value":"10.1.1.1"}]}]}"#;
    let (status, _, v) = post(&limiter, LOCAL, "/json", body, None).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["overallCode"], "OK");
    assert_eq!(v["statuses"][0]["code"], "OK");
    assert_eq!(v["statuses"][0]["currentLimit"]["requestsPerUnit"], 2);
    assert_eq!(v["statuses"][0]["currentLimit"]["unit"], "MINUTE");
    assert_eq!(v["statuses"][0]["limitRemaining"], 1);
    assert!(
        v["statuses"][0]["durationUntilReset"]
            .as_str()
            .unwrap()
            .ends_with('s')
    );
    // Original field names and integers as strings are accepted too.
    let snake = r#"{"domain":"edge","hits_addend":"1","descriptors":[{"entries":[{"key":"remote_address","value":"10.1.1.1"}]}]}"#;
    let (status, _, v) = post(&limiter, LOCAL, "/json", snake, None).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert!(
        v["statuses"][0].get("limitRemaining").is_none(),
        "0 is left out"
    );
    let (status, _, v) = post(&limiter, LOCAL, "/json", body, None).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(v["overallCode"], "OVER_LIMIT");
    assert_eq!(v["statuses"][0]["code"], "OVER_LIMIT");
}

/// `[k +1, k +0]` through `POST /json` at 1 an hour: the first request
/// is charged (its check-only copy reports the charge), every later one is
/// refused; a request of `[k +1, k +1]` can never pass.
async fn json_charges_every_copy_of_a_repeated_descriptor(limiter: &Limiter, tag: &str) {
    let body = |value: &str, addends: &[u64]| {
        let descriptors: Vec<Value> = addends
            .iter()
            .map(|a| {
                json!({"entries": [{"key": "tight", "value": value}], "hitsAddend": a.to_string()})
            })
            .collect();
        json!({"domain": "edge", "descriptors": descriptors}).to_string()
    };
    let k = format!("check-{tag}");
    let mut admitted = 0;
    for _ in 0..20 {
        let (status, _, v) = post(limiter, LOCAL, "/json", &body(&k, &[1, 0]), None).await;
        if status == StatusCode::OK {
            admitted += 1;
            assert_eq!(v["statuses"][1]["code"], "OK", "{v}");
            assert!(v["statuses"][1].get("limitRemaining").is_none(), "{v}");
        } else {
            assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{v}");
            assert_eq!(v["statuses"][0]["code"], "OVER_LIMIT", "{v}");
        }
    }
    assert_eq!(admitted, 1, "one hit an hour, charged by the first copy");
    let k = format!("pair-{tag}");
    let (status, _, v) = post(limiter, LOCAL, "/json", &body(&k, &[1, 1]), None).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{v}");
    assert_eq!(v["statuses"][0]["code"], "OK", "{v}");
    assert_eq!(v["statuses"][1]["code"], "OVER_LIMIT", "{v}");
    // Refused whole: the single hit still fits.
    let (status, _, v) = post(limiter, LOCAL, "/json", &body(&k, &[1]), None).await;
    assert_eq!(status, StatusCode::OK, "{v}");
}

#[tokio::test]
async fn json_charges_every_copy_of_a_repeated_descriptor_on_the_memory_store() {
    let (_dir, limiter) = app("").await;
    json_charges_every_copy_of_a_repeated_descriptor(&limiter, "memory").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_charges_every_copy_of_a_repeated_descriptor_on_redis() {
    let redis = support::RedisServer::start();
    let store = format!(
        "[store]\nkind = \"redis\"\nurl = \"{}\"\ntimeout_ms = 2000\n",
        redis.url()
    );
    let (_dir, limiter) = app_on(&store, "").await;
    json_charges_every_copy_of_a_repeated_descriptor(&limiter, "redis").await;
}

/// As envoyproxy/ratelimit's proto3 JSON parser: a field the message
/// does not have is refused with 400 naming it, at every level (a misspelt
/// `hitsAdend` must not pass for a request that charges the default); an
/// empty domain or descriptor list is refused too; an unlimited rule
/// reports all of u32 left.
#[tokio::test]
async fn json_refuses_unknown_fields_and_empty_requests_like_envoyproxy_ratelimit() {
    let (_dir, limiter) = app("").await;
    for (body, field) in [
        (
            r#"{"domain":"edge","descriptors":[{"entries":[{"key":"tight","value":"u"}]}],"hitsAdend":"0"}"#,
            "hitsAdend",
        ),
        (
            r#"{"domain":"edge","descriptors":[{"entries":[{"key":"tight","value":"u"}],"hits":0}]}"#,
            "hits",
        ),
        (
            r#"{"domain":"edge","descriptors":[{"entries":[{"key":"tight","value":"u","extra":1}]}]}"#,
            "extra",
        ),
        (
            r#"{"domain":"edge","descriptors":[{"entries":[{"key":"tight","value":"u"}],"limit":{"requestsPerUnit":5,"unit":"HOUR","per":1}}]}"#,
            "per",
        ),
    ] {
        let (status, _, v) = post(&limiter, LOCAL, "/json", body, None).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {v}");
        let error = v["error"].as_str().unwrap_or_default();
        assert!(error.contains(&format!("\"{field}\"")), "{error}");
    }
    // Nothing of the refused requests was charged.
    let one = r#"{"domain":"edge","descriptors":[{"entries":[{"key":"tight","value":"u"}]}]}"#;
    let (status, _, v) = post(&limiter, LOCAL, "/json", one, None).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    for (body, message) in [
        (
            r#"{"descriptors":[{"entries":[{"key":"tight","value":"u"}]}]}"#,
            "rate limit domain must not be empty",
        ),
        (
            r#"{"domain":"edge"}"#,
            "rate limit descriptor list must not be empty",
        ),
        (
            r#"{"domain":"edge","descriptors":[]}"#,
            "rate limit descriptor list must not be empty",
        ),
    ] {
        let (status, _, v) = post(&limiter, LOCAL, "/json", body, None).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {v}");
        assert_eq!(v["error"], message);
    }
    let free = r#"{"domain":"edge","descriptors":[{"entries":[{"key":"free","value":"u"}]}]}"#;
    let (status, _, v) = post(&limiter, LOCAL, "/json", free, None).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["statuses"][0]["limitRemaining"], 4_294_967_295u64, "{v}");
}

#[tokio::test]
async fn json_refuses_malformed_requests_with_400() {
    let (_dir, limiter) = app("").await;
    for bad in [
        "",
        "[",
        r#"{"domain":5}"#,
        r#"{"descriptors":[{"hitsAddend":-2}]}"#,
    ] {
        let (status, _, _) = post(&limiter, LOCAL, "/json", bad, None).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}");
    }
}

#[tokio::test]
async fn both_endpoints_answer_loopback_only_without_a_token() {
    let (_dir, limiter) = app("").await;
    for path in ["/json", "/v1/decide"] {
        let body = unmatched(path);
        let (status, _, _) = post(&limiter, REMOTE, path, body, None).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{path}");
        let (status, _, _) = post(&limiter, LOCAL, path, body, None).await;
        assert_eq!(status, StatusCode::OK, "{path}");
    }
}

#[tokio::test]
async fn with_a_token_every_caller_needs_it_and_remote_ones_may_come() {
    let (_dir, limiter) = app(r#"token = "s3cret-0123456789abcdef""#).await;
    for path in ["/json", "/v1/decide"] {
        let body = unmatched(path);
        for peer in [LOCAL, REMOTE] {
            let (status, _, _) = post(&limiter, peer, path, body, None).await;
            assert_eq!(status, StatusCode::UNAUTHORIZED, "{path} {peer}");
            let (status, _, _) = post(&limiter, peer, path, body, Some("wrong")).await;
            assert_eq!(status, StatusCode::UNAUTHORIZED, "{path} {peer}");
            let (status, _, _) =
                post(&limiter, peer, path, body, Some("s3cret-0123456789abcdef")).await;
            assert_eq!(status, StatusCode::OK, "{path} {peer}");
        }
    }
}

#[tokio::test]
async fn decide_by_key_answers_with_the_middleware_headers() {
    let (_dir, limiter) = app("").await;
    let body = json!({"key": "free_abc", "route": "/api/users", "method": "GET"}).to_string();
    let (status, h, v) = post(&limiter, LOCAL, "/v1/decide", &body, None).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["allowed"], true);
    assert_eq!(v["tier"], "free");
    assert_eq!(h["ratelimit-policy"], "\"burst\";q=2;w=3600");
    assert!(
        h["ratelimit"]
            .to_str()
            .unwrap()
            .starts_with("\"burst\";r=1;t=")
    );
    assert_eq!(h["x-ratelimit-remaining"], "1");
    // A peek reports without charging.
    let peek = json!({"key": "free_abc", "peek": true}).to_string();
    let (_, h, _) = post(&limiter, LOCAL, "/v1/decide", &peek, None).await;
    assert_eq!(h["x-ratelimit-remaining"], "1");
    // The export route costs 2: more than is left, refused, nothing charged.
    let export = json!({"key": "free_abc", "route": "/api/export", "method": "POST"}).to_string();
    let (status, h, v) = post(&limiter, LOCAL, "/v1/decide", &export, None).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{v}");
    assert!(h.contains_key("retry-after"));
    // An explicit cost overrides the route's.
    let one =
        json!({"key": "free_abc", "route": "/api/export", "method": "POST", "cost": 1}).to_string();
    let (status, h, _) = post(&limiter, LOCAL, "/v1/decide", &one, None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(h["x-ratelimit-remaining"], "0");
}

#[tokio::test]
async fn decide_by_descriptors_is_all_or_nothing_with_headers() {
    let (_dir, limiter) = app("").await;
    let both = json!({"domain": "edge", "descriptors": [
        {"remote_address": "10.9.9.9"}, {"tight": "x"}]})
    .to_string();
    let (status, h, v) = post(&limiter, LOCAL, "/v1/decide", &both, None).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["statuses"][1]["code"], "OK");
    assert!(h.contains_key("ratelimit-policy"));
    assert_eq!(h["x-ratelimit-remaining"], "0");
    // `tight` refuses: nothing charged on remote_address.
    let (status, h, v) = post(&limiter, LOCAL, "/v1/decide", &both, None).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{v}");
    assert!(h.contains_key("retry-after"));
    let one =
        json!({"domain": "edge", "descriptors": [{"remote_address": "10.9.9.9"}]}).to_string();
    let (status, _, v) = post(&limiter, LOCAL, "/v1/decide", &one, None).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(
        v["statuses"][0]["limitRemaining"],
        Value::Null,
        "0 left now"
    );
    // Bad shapes are a 400, never a panic.
    for bad in [
        json!({"key": "a", "identity": "b"}),
        json!({"domain": "edge", "descriptors": [{"k": 1}]}),
        json!({"key": "a", "tier": "nope"}),
        json!({"whatever": true}),
    ] {
        let (status, _, _) = post(&limiter, LOCAL, "/v1/decide", &bad.to_string(), None).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}");
    }
}

#[tokio::test]
async fn metrics_count_decisions_by_domain_and_rule_never_by_value() {
    let (_dir, limiter) = app("").await;
    ratewatch::service::RateLimitService::new(limiter.clone()).register_metrics();
    for value in ["secret-value-1", "secret-value-2", "secret-value-3"] {
        let body = json!({"domain": "edge", "descriptors": [{"entries": [
            {"key": "remote_address", "value": value}]}]})
        .to_string();
        post(&limiter, LOCAL, "/json", &body, None).await;
    }
    let body = r#"{"domain":"a-domain-nobody-configured","descriptors":[{"entries":[{"key":"k","value":"v"}]}]}"#;
    post(&limiter, LOCAL, "/json", body, None).await;
    post(&limiter, LOCAL, "/json", "[", None).await;
    let app = server::app(limiter.clone());
    let res = app
        .oneshot(Request::get("/metrics").body(Body::empty()).unwrap())
        .await
        .unwrap();
    let text =
        String::from_utf8(res.into_body().collect().await.unwrap().to_bytes().to_vec()).unwrap();
    assert!(
        !text.contains("secret-value"),
        "no descriptor value in a label"
    );
    assert!(!text.contains("a-domain-nobody-configured"));
    assert!(text.contains(
        r#"ratewatch_rls_decisions_total{domain="_unknown",rule="_unmatched",outcome="ok"}"#
    ));
    assert!(
        text.contains(r#"domain="edge",rule="remote_address",outcome="ok"}"#),
        "{text}"
    );
    // Configured rules exist (at zero before any traffic; other tests of
    // this process share the recorder, so only presence is checked).
    assert!(
        text.contains(r#"domain="edge",rule="tight",outcome="shadow_over_limit"}"#),
        "{text}"
    );
    assert!(text.contains(r#"ratewatch_rls_errors_total{api="json",reason="bad_request"}"#));
    assert!(
        text.contains(r#"ratewatch_rls_errors_total{api="grpc",reason="store_unavailable"} 0"#)
    );
    assert!(text.contains("# HELP ratewatch_rls_decisions_total"));
    assert!(text.contains("ratewatch_rls_request_duration_seconds_bucket{api=\"json\",le="));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_serves_json_on_its_listen_port() {
    let (_dir, file) = policy("");
    let rw = support::Ratewatch::start("serve", Some(&file), &[]);
    let client = reqwest::Client::new();
    let body = r#"{"domain":"edge","descriptors":[{"entries":[{"key":"tight","value":"bin"}]}]}"#;
    let first = client
        .post(format!("{}/json", rw.url()))
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(first.status(), 200);
    let second = client
        .post(format!("{}/json", rw.url()))
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(second.status(), 429);
    let v: Value = second.json().await.unwrap();
    assert_eq!(v["overallCode"], "OVER_LIMIT");
}

#[tokio::test]
async fn a_native_rule_resolves_a_descriptor_value_to_a_tier_and_decides_its_limits() {
    let native = r#"
[[rls.domains]]
name = "api"

[[rls.domains.rules]]
descriptor = ["api_key"]
tier_from = "api_key"
"#;
    let (_dir, limiter) = app(native).await;
    let ask = |key: &str, cost: Option<u64>| {
        let mut body = json!({"domain": "api", "descriptors": [{"api_key": key}]});
        if let Some(c) = cost {
            body["cost"] = json!(c);
        }
        body.to_string()
    };
    // The free tier allows 2 per hour; a check at cost 0 charges nothing.
    let (status, _, v) = post(
        &limiter,
        LOCAL,
        "/v1/decide",
        &ask("free_t1", Some(0)),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["statuses"][0]["limitRemaining"], 2);
    for left in [1, 0] {
        let (status, h, v) = post(&limiter, LOCAL, "/v1/decide", &ask("free_t1", None), None).await;
        assert_eq!(status, StatusCode::OK, "{v}");
        assert_eq!(h["x-ratelimit-remaining"], left.to_string().as_str());
    }
    let (status, _, v) = post(&limiter, LOCAL, "/v1/decide", &ask("free_t1", None), None).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{v}");
    // Another key has its own counter.
    let (status, _, _) = post(&limiter, LOCAL, "/v1/decide", &ask("free_t2", None), None).await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_shows_blocked_and_hot_descriptors_masked_like_keys() {
    let (_dir, limiter) = app("[telemetry]\nflush_interval_ms = 100\n").await;
    let body = json!({"domain": "edge", "descriptors": [{"entries": [
        {"key": "tight", "value": "a-secret-descriptor-value"}]}]})
    .to_string();
    for _ in 0..5 {
        post(&limiter, LOCAL, "/json", &body, None).await;
    }
    let stats = support::eventually(
        std::time::Duration::from_secs(10),
        "the blocked descriptor on the dashboard",
        || {
            let limiter = limiter.clone();
            async move {
                let app = server::app(limiter)
                    .layer(MockConnectInfo(LOCAL.parse::<SocketAddr>().unwrap()));
                let res = app
                    .oneshot(
                        Request::get("/dashboard/api/stats?range=5m")
                            .body(Body::empty())
                            .unwrap(),
                    )
                    .await
                    .ok()?;
                let bytes = res.into_body().collect().await.ok()?.to_bytes();
                let v: Value = serde_json::from_slice(&bytes).ok()?;
                let blocked = v["top_blocked"].as_array()?;
                (!blocked.is_empty()).then_some((v, String::from_utf8_lossy(&bytes).into_owned()))
            }
        },
    )
    .await;
    let (v, text) = stats;
    let top = &v["top_blocked"][0];
    assert_eq!(top["blocked"], 4, "{top}");
    let shown = top["identity"].as_str().unwrap();
    assert!(
        shown.starts_with("tight=a") && shown.contains('…'),
        "{shown}"
    );
    assert!(
        !text.contains("a-secret-descriptor-value"),
        "the raw value never shows"
    );
    assert!(
        v["hot_keys"]
            .as_array()
            .unwrap()
            .iter()
            .any(|h| h["identity"] == top["identity"]),
        "{}",
        v["hot_keys"]
    );
}

/// A policy whose `[identity] unmatched_keys` is `unmatched`: tier `paid`
/// for `paid_` keys, `free` (2 an hour) for the anonymous caller, and a
/// native domain resolving `api_key` values to tiers.
async fn unmatched_app(unmatched: &str) -> (tempfile::TempDir, Limiter) {
    let dir = tempfile::tempdir().expect("temp dir");
    let toml = format!(
        r#"
[identity]
default_tier = "paid"
anonymous_tier = "free"
unmatched_keys = "{unmatched}"

[[tiers]]
name = "paid"
match_prefix = "paid_"
limits = [{{ name = "burst", algorithm = "fixed_window", limit = 50, window = "1h" }}]

[[tiers]]
name = "free"
limits = [{{ name = "burst", algorithm = "fixed_window", limit = 2, window = "1h" }}]

[[rls.domains]]
name = "api"

[[rls.domains.rules]]
descriptor = ["api_key"]
tier_from = "api_key"
"#
    );
    let file = dir.path().join("ratewatch.toml");
    std::fs::write(&file, toml).expect("toml");
    let limiter = Limiter::from_config_file(&file).await.expect("limiter");
    (dir, limiter)
}

/// `unmatched_keys = "reject"`: a key that names no tier is refused by
/// `/v1/decide` with the middleware's 401, and a `tier_from` value that
/// names none is OVER_LIMIT; a key of a tier is decided as before.
#[tokio::test]
async fn decide_and_tier_from_refuse_a_key_of_no_tier_when_unmatched_keys_rejects() {
    let (_dir, limiter) = unmatched_app("reject").await;
    let key = |k: &str| json!({"key": k, "route": "/api/users"}).to_string();
    let (status, _, v) = post(&limiter, LOCAL, "/v1/decide", &key("invented"), None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{v}");
    let (status, _, v) = post(&limiter, LOCAL, "/v1/decide", &key("paid_k"), None).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["tier"], "paid");
    let desc = |k: &str| json!({"domain": "api", "descriptors": [{"api_key": k}]}).to_string();
    let (status, _, v) = post(&limiter, LOCAL, "/v1/decide", &desc("invented"), None).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{v}");
    assert_eq!(v["statuses"][0]["code"], "OVER_LIMIT", "{v}");
    let (status, _, v) = post(&limiter, LOCAL, "/v1/decide", &desc("paid_k"), None).await;
    assert_eq!(status, StatusCode::OK, "{v}");
}

/// `unmatched_keys = "anonymous"`: keys that name no tier are the one
/// anonymous caller, so inventing keys mints no quota, by key and by
/// `tier_from` alike.
#[tokio::test]
async fn decide_and_tier_from_count_keys_of_no_tier_as_one_anonymous_caller() {
    let (_dir, limiter) = unmatched_app("anonymous").await;
    let key = |k: &str| json!({"key": k, "route": "/api/users"}).to_string();
    let mut by_key = Vec::new();
    for k in ["made_up_1", "made_up_2", "made_up_3"] {
        let (status, _, v) = post(&limiter, LOCAL, "/v1/decide", &key(k), None).await;
        assert_eq!(v["tier"], "free", "{v}");
        by_key.push(status.as_u16());
    }
    assert_eq!(by_key, [200, 200, 429], "one anonymous quota of 2");
    let desc = |k: &str| json!({"domain": "api", "descriptors": [{"api_key": k}]}).to_string();
    let mut by_descriptor = Vec::new();
    for k in ["made_up_4", "made_up_5", "made_up_6"] {
        let (status, _, _) = post(&limiter, LOCAL, "/v1/decide", &desc(k), None).await;
        by_descriptor.push(status.as_u16());
    }
    assert_eq!(by_descriptor, [200, 200, 429], "one anonymous quota of 2");
    let (status, _, v) = post(&limiter, LOCAL, "/v1/decide", &desc("paid_k"), None).await;
    assert_eq!(status, StatusCode::OK, "{v}");
}

/// The README's export rule (a GCRA of burst 10 and a daily quota):
/// `[k +10, k +0]` charges 10 per request, so a burst of 100 such
/// requests gets about one through, not all of them.
#[tokio::test]
async fn a_heavy_descriptor_sent_twice_is_charged_and_refused_like_a_single_one() {
    let native = r#"
[[rls.domains]]
name = "api"

[[rls.domains.rules]]
descriptor = ["generic_key=export", "api_key"]
name = "export"
cost = 5
limits = [
  { name = "steady", algorithm = "gcra", rate_per_second = 2.0, burst = 10 },
  { name = "daily", algorithm = "fixed_window", limit = 500, window = "1d" },
]
"#;
    let (_dir, limiter) = app(native).await;
    let d = |addend: u64| {
        json!({"entries": [{"key": "generic_key", "value": "export"}, {"key": "api_key", "value": "k"}],
               "hitsAddend": addend})
    };
    let body = json!({"domain": "api", "descriptors": [d(10), d(0)]}).to_string();
    let mut admitted = 0;
    for _ in 0..100 {
        let (status, _, _) = post(&limiter, LOCAL, "/json", &body, None).await;
        admitted += usize::from(status == StatusCode::OK);
    }
    // A burst of 10 and 2 a second: one request of 10 now, and one more
    // per 5 s the loop might take on a loaded machine.
    assert!((1..=4).contains(&admitted), "{admitted} of 100 admitted");
}
