//! envoyproxy/ratelimit's opt-in extras of a descriptor: per-value
//! statistics (`detailed_metric`, `value_to_metric`), bounded to the top
//! `[rls] detailed_metric_top_k` values of a rule, and the answer's
//! `dynamic_metadata` (`[rls] response_dynamic_metadata`).

use std::net::SocketAddr;

use axum::body::Body;
use axum::extract::connect_info::MockConnectInfo;
use http::Request;
use http_body_util::BodyExt;
use ratewatch::{Limiter, server};
use serde_json::{Value, json};
use tower::ServiceExt;

const STATS_YAML: &str = r#"
domain: stats
descriptors:
  - key: user
    detailed_metric: true
    rate_limit:
      unit: hour
      requests_per_unit: 1000
  - key: path
    value: /api/*
    value_to_metric: true
    rate_limit:
      unit: hour
      requests_per_unit: 5
  - key: quiet
    rate_limit:
      unit: hour
      requests_per_unit: 1000
"#;

async fn limiter(yaml: &str, rls: &str) -> (tempfile::TempDir, Limiter) {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(dir.path().join("peer.yaml"), yaml).expect("yaml");
    let toml = format!("[rls]\nenvoy_configs = [\"peer.yaml\"]\n{rls}\n");
    std::fs::write(dir.path().join("ratewatch.toml"), toml).expect("toml");
    let limiter = Limiter::from_config_file(dir.path().join("ratewatch.toml"))
        .await
        .expect("limiter");
    ratewatch::service::RateLimitService::new(limiter.clone()).register_metrics();
    (dir, limiter)
}

async fn json(app: &axum::Router, body: Value) -> Value {
    let res = app
        .clone()
        .oneshot(
            Request::post("/json")
                .header("content-type", "application/json")
                .body(Body::from(body.to_string()))
                .unwrap(),
        )
        .await
        .unwrap();
    let bytes = res.into_body().collect().await.unwrap().to_bytes();
    serde_json::from_slice(&bytes).expect("a JSON answer")
}

fn one(domain: &str, entries: &[(&str, &str)]) -> Value {
    let entries: Vec<Value> = entries
        .iter()
        .map(|(k, v)| json!({"key": k, "value": v}))
        .collect();
    json!({"domain": domain, "descriptors": [{"entries": entries}]})
}

async fn scrape(app: &axum::Router) -> String {
    let res = app
        .clone()
        .oneshot(Request::get("/metrics").body(Body::empty()).unwrap())
        .await
        .unwrap();
    String::from_utf8(res.into_body().collect().await.unwrap().to_bytes().to_vec()).unwrap()
}

fn app(limiter: &Limiter) -> axum::Router {
    let local: SocketAddr = "127.0.0.1:5000".parse().unwrap();
    server::app(limiter.clone()).layer(MockConnectInfo(local))
}

/// The series of `ratewatch_rls_descriptor_hits_total` for `key`, with
/// their values.
fn series<'a>(text: &'a str, key: &str) -> Vec<(&'a str, f64)> {
    let key = format!("key=\"{key}\"");
    text.lines()
        .filter(|l| l.starts_with("ratewatch_rls_descriptor_hits_total{") && l.contains(&key))
        .map(|l| {
            let (name, n) = l.rsplit_once(' ').unwrap();
            (name, n.parse().unwrap())
        })
        .collect()
}

#[tokio::test]
async fn a_thousand_values_against_top_k_ten_make_at_most_eleven_series_and_the_heaviest_keeps_its_own()
 {
    let (_dir, limiter) = limiter(STATS_YAML, "detailed_metric_top_k = 10").await;
    let app = app(&limiter);
    for i in 0..1000 {
        let heavy = json(&app, one("stats", &[("user", "heavy-hitter")])).await;
        assert_eq!(heavy["overallCode"], "OK", "{heavy}");
        for _ in 0..2 {
            json(&app, one("stats", &[("user", &format!("u{i}"))])).await;
        }
    }
    let text = scrape(&app).await;
    let user = series(&text, "user");
    assert!(!user.is_empty(), "{text}");
    let values: std::collections::HashSet<&str> = user
        .iter()
        .map(|(l, _)| {
            l.split("value=\"")
                .nth(1)
                .unwrap()
                .split('"')
                .next()
                .unwrap()
        })
        .collect();
    // Ten values of their own and _other, each a series per result.
    assert!(values.len() <= 11, "{} values: {values:?}", values.len());
    assert!(user.len() <= 11 * 3, "{} series: {user:?}", user.len());
    let heavy: f64 = user
        .iter()
        .filter(|(l, _)| l.contains(r#"value="user_heavy-hitter""#))
        .map(|(_, n)| n)
        .sum();
    // Its first request counts under _other, every later one on its own.
    assert_eq!(heavy, 999.0, "{user:?}");
    let total: f64 = user.iter().map(|(_, n)| n).sum();
    assert_eq!(total, 3000.0, "every hit is in some series");
    assert!(user.iter().any(|(l, _)| l.contains(r#"value="_other""#)));
    assert!(
        user.iter()
            .all(|(l, _)| l.contains(r#"result="within_limit""#)
                || l.contains(r#"result="near_limit""#)),
        "{user:?}"
    );
}

#[tokio::test]
async fn value_to_metric_names_the_wildcard_level_by_the_request_value_and_counts_over_limit() {
    let (_dir, limiter) = limiter(STATS_YAML, "").await;
    let app = app(&limiter);
    for _ in 0..7 {
        json(&app, one("stats", &[("path", "/api/orders")])).await;
    }
    let text = scrape(&app).await;
    let path = series(&text, "path_/api/*");
    let find = |result: &str| {
        path.iter()
            .find(|(l, _)| {
                l.contains(r#"value="path_/api/orders""#)
                    && l.contains(&format!("result=\"{result}\""))
            })
            .map(|(_, n)| *n)
    };
    // The first request counts under _other until the value has a series.
    assert_eq!(find("over_limit"), Some(2.0), "{path:?}");
    assert_eq!(
        find("within_limit").unwrap_or(0.0) + find("near_limit").unwrap_or(0.0),
        4.0,
        "{path:?}"
    );
}

#[tokio::test]
async fn a_rule_that_asks_for_no_per_value_statistics_never_puts_a_value_in_a_label() {
    let (_dir, limiter) = limiter(STATS_YAML, "").await;
    let app = app(&limiter);
    for _ in 0..3 {
        json(&app, one("stats", &[("quiet", "secret-value-9")])).await;
    }
    let text = scrape(&app).await;
    assert!(!text.contains("secret-value-9"));
    assert!(series(&text, "quiet").is_empty());
}

#[test]
fn detailed_metric_top_k_must_be_between_one_and_a_thousand() {
    for bad in ["0", "1001", "-1", "\"ten\""] {
        let toml = format!("[rls]\ndetailed_metric_top_k = {bad}\n");
        let err = ratewatch::Policy::from_toml_str(&toml, None).unwrap_err();
        assert!(
            err.to_string().contains("detailed_metric_top_k"),
            "{bad}: {err}"
        );
    }
    let p = ratewatch::Policy::from_toml_str("[rls]\ndetailed_metric_top_k = 1000\n", None)
        .expect("1000 is accepted");
    assert_eq!(p.rls.detailed_metric_top_k, 1000);
}

const METADATA_YAML: &str = r#"
domain: test-domain
descriptors:
  - key: key1
    value: value1
    descriptors:
      - key: subkey1
        rate_limit:
          unit: second
          requests_per_unit: 5
        metadata:
          name: service_1
          weight: 3
          flags: [a, "b"]
  - key: key2
    rate_limit:
      unit: minute
      requests_per_unit: 20
    metadata:
      service_with_quota:
        name: service_2
      name: not_the_first
  - key: tight
    rate_limit:
      unit: hour
      requests_per_unit: 1
    metadata:
      tight_one: yes
  - key: free
    rate_limit:
      unlimited: true
    metadata:
      free_one: true
"#;

/// Serves gRPC for `limiter` on a free port.
async fn grpc(limiter: &Limiter) -> tonic::transport::Channel {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let service = ratewatch::service::RateLimitService::new(limiter.clone());
    tokio::spawn(ratewatch::service::serve(
        service,
        listener,
        std::future::pending(),
    ));
    tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .expect("connect")
}

async fn ask(
    channel: &tonic::transport::Channel,
    descriptors: &[&[(&str, &str)]],
    hits_addend: u32,
) -> ratewatch::service::proto::RateLimitResponse {
    use ratewatch::service::grpc::ProstCodec;
    use ratewatch::service::proto::{
        Entry, RateLimitDescriptor, RateLimitRequest, RateLimitResponse,
    };
    let request = RateLimitRequest {
        domain: "test-domain".into(),
        descriptors: descriptors
            .iter()
            .map(|entries| RateLimitDescriptor {
                entries: entries
                    .iter()
                    .map(|(k, v)| Entry {
                        key: (*k).into(),
                        value: (*v).into(),
                    })
                    .collect(),
                limit: None,
                hits_addend: None,
            })
            .collect(),
        hits_addend,
    };
    let mut grpc = tonic::client::Grpc::new(channel.clone());
    grpc.ready().await.expect("ready");
    grpc.unary(
        tonic::Request::new(request),
        http::uri::PathAndQuery::from_static(
            "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
        ),
        ProstCodec::<RateLimitRequest, RateLimitResponse>::default(),
    )
    .await
    .expect("an answer")
    .into_inner()
}

#[tokio::test]
async fn dynamic_metadata_over_grpc_carries_the_request_and_the_passed_rules_metadata() {
    let (_dir, limiter) = limiter(METADATA_YAML, "response_dynamic_metadata = true").await;
    let c = grpc(&limiter).await;
    let r = ask(
        &c,
        &[
            &[("key1", "value1"), ("subkey1", "x")],
            &[("key2", "y")],
            &[("free", "z")],
            &[("nobody", "n")],
        ],
        2,
    )
    .await;
    let meta = r.dynamic_metadata.expect("dynamic_metadata").to_json();
    assert_eq!(
        meta,
        json!({
            "domain": "test-domain",
            "hitsAddend": 2,
            "descriptors": [
                {"entries": ["key1=value1", "subkey1=x"]},
                {"entries": ["key2=y"]},
                {"entries": ["free=z"]},
                {"entries": ["nobody=n"]},
            ],
            // The first rule's `name` wins; objects merge; the unlimited
            // rule's metadata is not there.
            "metadata": {
                "name": "service_1",
                "weight": 3,
                "flags": ["a", "b"],
                "service_with_quota": {"name": "service_2"},
            },
        })
    );
    // Over its limit, a rule's metadata is left out.
    let first = ask(&c, &[&[("tight", "t")]], 0).await;
    let first = first.dynamic_metadata.unwrap().to_json();
    assert_eq!(first["metadata"], json!({"tight_one": true}));
    let second = ask(&c, &[&[("tight", "t")]], 0).await;
    assert_eq!(second.overall_code, 2, "OVER_LIMIT");
    let second = second.dynamic_metadata.unwrap().to_json();
    assert!(second.get("metadata").is_none(), "{second}");
    assert!(second.get("hitsAddend").is_none(), "{second}");
    assert_eq!(second["descriptors"], json!([{"entries": ["tight=t"]}]));
}

#[tokio::test]
async fn without_response_dynamic_metadata_answers_carry_none() {
    let (_dir, limiter) = limiter(METADATA_YAML, "").await;
    let c = grpc(&limiter).await;
    let r = ask(&c, &[&[("key2", "y")]], 0).await;
    assert_eq!(r.dynamic_metadata, None);
    let v = json(&app(&limiter), one("test-domain", &[("key2", "y")])).await;
    assert!(v.get("dynamicMetadata").is_none(), "{v}");
}

#[tokio::test]
async fn post_json_carries_dynamic_metadata_as_an_object() {
    let (_dir, limiter) = limiter(METADATA_YAML, "response_dynamic_metadata = true").await;
    let v = json(&app(&limiter), one("test-domain", &[("key2", "y")])).await;
    assert_eq!(
        v["dynamicMetadata"],
        json!({
            "domain": "test-domain",
            "descriptors": [{"entries": ["key2=y"]}],
            "metadata": {"service_with_quota": {"name": "service_2"}, "name": "not_the_first"},
        }),
        "{v}"
    );
}

#[test]
fn metadata_that_is_not_a_mapping_is_refused_with_its_line() {
    let yaml = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n    metadata: [1, 2]\n";
    let err = ratewatch::policy::rls::Domain::from_envoy_yaml(yaml, Some("d.yaml")).unwrap_err();
    assert_eq!(err.line(), Some(5));
    assert_eq!(err.field(), Some("descriptors[0].metadata"));
}

#[test]
fn response_dynamic_metadata_in_the_peer_environment_turns_the_answer_on() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("current/ratelimit/config");
    std::fs::create_dir_all(&config).unwrap();
    std::fs::write(config.join("m.yaml"), METADATA_YAML).unwrap();
    let root = dir.path().join("current").display().to_string();
    let vars = |name: &str| match name {
        "RUNTIME_ROOT" => Some(root.clone()),
        "RUNTIME_SUBDIRECTORY" => Some("ratelimit".to_owned()),
        "REDIS_URL" => Some("127.0.0.1:6379".to_owned()),
        "RESPONSE_DYNAMIC_METADATA" => Some("true".to_owned()),
        _ => None,
    };
    let peer = ratewatch::policy::peer_env::PeerEnv::from_vars(vars)
        .expect("accepted")
        .expect("the peer's environment");
    assert!(peer.policy().unwrap().rls.response_dynamic_metadata);
}
